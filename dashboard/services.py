"""What one service process holds: settings, database, policy, token verifier, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from turnout.dashboard.alertmanager import Receivers, load_receivers
from turnout.dashboard.auth import TokenVerifier
from turnout.dashboard.heavy_reads import HeavyReads
from turnout.dashboard.metrics import Metrics
from turnout.dashboard.policy import Policy
from turnout.dashboard.settings import Settings
from turnout.dashboard.store.db import Database
from turnout.dashboard.write_gate import WriteGate


@dataclass
class Services:
    settings: Settings
    db: Database
    policy: Policy
    verifier: TokenVerifier
    metrics: Metrics
    alerts: Receivers = field(default_factory=Receivers)  # TURNOUT_ALERTMANAGER_CONFIG
    heavy_reads: HeavyReads = field(default_factory=lambda: HeavyReads(2, 1))
    write_gate: WriteGate = field(default_factory=WriteGate)

    def require_approval(self) -> bool:
        """Enabling changes wait for a second operator: this process's
        ``TURNOUT_REQUIRE_APPROVAL`` or the one the service recorded when it started
        (``dashboard/store/approval_setting.py``), so a shell without the variable cannot
        go around the service's rule."""
        if self.settings.require_approval:
            return True
        from turnout.dashboard.store import approval_setting

        with self.db.read_session() as session:
            return approval_setting.recorded(session=session)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        """The services of ``settings``.

        Raises:
            DatabaseUnavailable: the database URL cannot be used.
            AlertConfigError: ``alertmanager_config`` names a file that cannot be used.
            OracleError: the pack cannot be loaded.
        """
        alerts = load_receivers(settings.alertmanager_config)
        db = Database(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
        metrics = Metrics()
        metrics.watch_health(db.read_session, settings.health_metrics_window_s)
        return cls(
            settings=settings,
            db=db,
            policy=Policy(settings.pack, db, settings.snapshot_ttl_s),
            verifier=TokenVerifier(db.read_session, settings.token_cache_ttl_s),
            metrics=metrics,
            alerts=alerts,
            heavy_reads=HeavyReads(settings.max_heavy_reads, settings.max_heavy_reads_per_token),
        )
