"""``python -m referee``: golden files, and a pack checked against a live vLLM release.

    python -m referee golden --release 0.31 --seed 1 --count 4000 --out FILE
    python -m referee check  --release 0.31 --seed 7 --count 2000 [--pack vllm-0.31]
    python -m referee case   --release 0.31 '{"architecture": "LlamaForCausalLM", ...}'
    python -m referee flags  --release 0.31 --out policies/reference/vllm-0.31/flags.json
    python -m referee flags-recipes --release 0.31 --out FILE   # vLLM's verdict per recipe
    python -m referee flags-check --release 0.31 --seed 7 --count 2000
    python -m referee metrics --release 0.33 --out policies/reference/vllm-0.33/metrics.json
    python -m referee draft-registry --release 0.33 --write  # the pack's registry facts
    python -m referee serve-check --release 0.33 --seed 303 --count 1000 [--coverage F]
    python -m referee serve-golden --release 0.33 --seed 1 --count 1000 --out FILE
    python -m referee coverage-doc .referee/coverage-0.29.json ... --out FILE

Run inside the release's referee environment (``make referee`` builds
``.referee/venv-<release>``); the installed vLLM must be the release named.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from referee import RELEASES
from referee.generator import generate


def _check_installed(release: str) -> None:
    import vllm

    installed = ".".join(vllm.__version__.split(".")[:2])
    if installed != release:
        raise SystemExit(
            f"referee: this environment has vLLM {vllm.__version__}, not "
            f"{release} (use .referee/venv-{release}/bin/python)"
        )


def _golden(args: argparse.Namespace) -> int:
    from referee.harness import run_case

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import vllm

    lines, failures = [], []
    for case in generate(args.seed, args.count, args.release):
        try:
            want = run_case(case["config"], args.release)
        except Exception as exc:  # the harness met something it does not model: fix it
            failures.append(f"{case['id']} {json.dumps(case['config'])}: {exc!r}")
            continue
        lines.append(
            json.dumps(
                {
                    "id": case["id"],
                    "config": case["config"],
                    "want": want,
                    "vllm_version": vllm.__version__,
                },
                sort_keys=True,
            )
        )
    if failures:
        print("\n".join(failures[:20]), file=sys.stderr)
        raise SystemExit(
            f"referee: {len(failures)} cases the harness could not run; nothing written"
        )
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {"release": args.release, "seed": args.seed, "cases": len(lines), "out": str(out)}
        )
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from referee.compare import compare_pack
    from referee.harness import run_case

    t0 = time.perf_counter()
    cases = [
        (c, run_case(c["config"], args.release))
        for c in generate(args.seed, args.count, args.release)
    ]
    report = compare_pack(args.pack or f"vllm-{args.release}", cases)
    report.update(release=args.release, seed=args.seed, seconds=round(time.perf_counter() - t0, 1))
    for miss in report.pop("mismatches")[: args.show]:
        print(json.dumps(miss, sort_keys=True), file=sys.stderr)
    print(json.dumps(report, sort_keys=True))
    return 0 if report["agree_all"] >= args.min_agreement else 1


def _case(args: argparse.Namespace) -> int:
    from referee.harness import run_case

    spec: dict[str, Any] = json.loads(args.spec)
    print(json.dumps(run_case(spec, args.release), indent=2))
    return 0


def _facts(args: argparse.Namespace) -> int:
    from referee.facts import facts

    for arch in args.architectures:
        print(json.dumps({"architecture": arch, "facts": facts(arch)}, sort_keys=True))
    return 0


def _flags(args: argparse.Namespace) -> int:
    from referee.flags import flag_table
    from referee.flags_probe import dumps

    table = flag_table()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(table), encoding="utf-8")
    print(
        json.dumps(
            {
                "release": args.release,
                "actions": len(table["actions"]),
                "configs": len(table["configs"]),
                "out": str(out),
            }
        )
    )
    return 0


def _flags_recipes(args: argparse.Namespace) -> int:
    from referee.flags_check import recipes

    counts = recipes(Path(args.out))
    print(json.dumps({"release": args.release, **counts, "out": args.out}))
    return 0


def _flags_check(args: argparse.Namespace) -> int:
    from referee.flags_check import check

    t0 = time.perf_counter()
    report = check(args.release, args.seed, args.count, args.show)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    for miss in report.pop("mismatches"):
        print(json.dumps(miss), file=sys.stderr)
    print(json.dumps(report))
    return 0 if report["agreement"] >= args.min_agreement else 1


def _metrics(args: argparse.Namespace) -> int:
    from referee.metrics import dumps, metric_table, source_version, vllm_source

    source = Path(args.source) if args.source else vllm_source()
    version = source_version(source)
    if ".".join(version.split(".")[:2]) != args.release:
        raise SystemExit(f"referee metrics: {source} is vLLM {version}, not {args.release}")
    table = metric_table(source)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(table), encoding="utf-8")
    print(json.dumps({"release": args.release, "metrics": len(table["metrics"]), "out": str(out)}))
    return 0


def _serve_check(args: argparse.Namespace) -> int:
    """The pack against the release's own ``create_engine_config`` on seeded ``vllm serve``
    lines (:mod:`referee.serve_gen`); one JSON report on stdout, mismatches to ``--out``."""
    from collections import Counter

    from referee.compare import Tally, line_answer
    from referee.serve_gen import generate, resolve, write_models
    from referee.serve_real import run_case
    from turnout.oracle import load_pack

    root = Path(__file__).resolve().parent.parent
    table = json.loads(
        (root / "policies" / "reference" / f"vllm-{args.release}" / "flags.json").read_text()
    )
    models = write_models(Path(args.models).resolve())
    folder = Path(args.models).resolve()
    assert models, "no model configs"
    pack = load_pack(args.pack or f"vllm-{args.release}")
    t0 = time.perf_counter()
    tally = Tally()
    classes: Counter[str] = Counter()
    failures: list[str] = []
    mismatches: list[dict[str, Any]] = []
    cases = list(generate(table, args.seed, args.count))
    cov = None
    if args.coverage:
        import vllm

        from referee import branches

        # The first case imports the model classes, torch and transformers: traced, those
        # imports take a minute and a half. Run it once untraced; it is measured with the rest.
        if cases:
            run_case(cases[0], folder)
        vllm_root = Path(vllm.__file__).resolve().parent
        cov = branches.start(vllm_root)
    for case in cases:
        try:
            want = run_case(case, folder)
        except Exception as exc:  # vLLM met something the stand-ins do not cover: named
            failures.append(f"{case['id']}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        got = line_answer(pack, case, resolve(case["argv"], folder), args.release)
        if not tally.add(want, got):
            key = f"vllm {want['decision']} / turnout {got['decision']}: " + (
                (want.get("error") or "")[:90]
                if want["decision"] == "error"
                else (got.get("error") or "")[:90]
                if got["decision"] in ("error", "invalid")
                else "log lines differ"
            )
            classes[key] += 1
            mismatches.append({**case, "want": want, "got": got})
    report = {
        "release": args.release,
        "seed": args.seed,
        "cases": tally.total,
        "by_decision": dict(tally.by_decision),
        "identical": tally.share(tally.same_all),
        "same_decision": tally.share(tally.same_decision),
        "harness_failures": len(failures),
        "classes": dict(classes.most_common(args.show)),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if cov is not None:
        branch_report = branches.report(cov, vllm_root, args.release, tally.total)
        Path(args.coverage).write_text(json.dumps(branch_report, indent=1) + "\n", "utf-8")
        report["branches"] = {
            rel: [f["covered_branches"], f["num_branches"]]
            for rel, f in branch_report["files"].items()
        }
    if args.out:
        Path(args.out).write_text(
            "".join(json.dumps(m, sort_keys=True) + "\n" for m in mismatches), encoding="utf-8"
        )
    for line in failures[: args.show]:
        print(line, file=sys.stderr)
    print(json.dumps(report, sort_keys=True))
    return 0


def _serve_golden(args: argparse.Namespace) -> int:
    """vLLM's own answers (``create_engine_config``, :mod:`referee.serve_real`) on seeded
    ``vllm serve`` lines, written as the release's serve golden file: one case per line with
    its ``want``; the model folders stay as ``{models}`` (tests/oracle/test_serve_golden.py
    writes them from policies/reference/model_configs)."""
    import vllm

    from referee.serve_gen import generate, write_models
    from referee.serve_real import run_case

    root = Path(__file__).resolve().parent.parent
    table = json.loads(
        (root / "policies" / "reference" / f"vllm-{args.release}" / "flags.json").read_text()
    )
    folder = Path(args.models).resolve()
    assert write_models(folder), "no model configs"
    lines, failures = [], []
    for case in generate(table, args.seed, args.count):
        try:
            want = run_case(case, folder)
        except Exception as exc:  # vLLM met something the stand-ins do not cover: named
            failures.append(f"{case['id']}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        # vLLM's texts may name the model's folder (the LoRA refusal): kept as {models}
        want = json.loads(json.dumps(want).replace(str(folder), "{models}"))
        line = {**case, "want": want, "vllm_version": vllm.__version__}
        lines.append(json.dumps(line, sort_keys=True) + "\n")
    out = Path(args.out)
    out.write_text("".join(lines), encoding="utf-8")
    for failure in failures:
        print(failure, file=sys.stderr)
    print(json.dumps({"release": args.release, "cases": len(lines), "skipped": len(failures)}))
    return 0


def _draft_registry(args: argparse.Namespace) -> int:
    """The release's registry facts (referee.registry), printed or written into its pack."""
    from referee.registry import blocks, write

    pack_file = (
        Path(__file__).resolve().parent.parent
        / "policies"
        / f"vllm-{args.release}"
        / "capability_matrix.yaml"
    )
    if args.write:
        write(args.release, pack_file)
        print(json.dumps({"release": args.release, "written": str(pack_file)}))
    else:
        derived, texts = blocks(args.release)
        print("\n".join(["derived:", *derived, *texts]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m referee",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("golden", "check", "case", "facts"):
        p = sub.add_parser(name)
        p.add_argument("--release", required=True, choices=RELEASES)
        if name not in ("case", "facts"):
            p.add_argument("--seed", type=int, required=True)
            p.add_argument("--count", type=int, required=True)
    sub.choices["golden"].add_argument("--out", required=True)
    check = sub.choices["check"]
    check.add_argument("--pack", help="pack name or folder (default vllm-<release>)")
    check.add_argument("--show", type=int, default=10, help="mismatches to print (stderr)")
    check.add_argument("--min-agreement", type=float, default=0.995)
    sub.choices["case"].add_argument("spec", help="a spec as JSON")
    sub.choices["facts"].add_argument("architectures", nargs="+")
    flags = sub.add_parser("flags", help="write the release's vllm serve flag table")
    flags.add_argument("--release", required=True, choices=RELEASES)
    flags.add_argument("--out", required=True)
    recipes = sub.add_parser("flags-recipes", help="the release's verdict on every recipe line")
    recipes.add_argument("--release", required=True, choices=RELEASES)
    recipes.add_argument("--out", required=True)
    fcheck = sub.add_parser("flags-check", help="the oracle's parser against the release's")
    fcheck.add_argument("--release", required=True, choices=RELEASES)
    fcheck.add_argument("--seed", type=int, required=True)
    fcheck.add_argument("--count", type=int, required=True)
    fcheck.add_argument("--show", type=int, default=10, help="mismatches to print (stderr)")
    fcheck.add_argument("--min-agreement", type=float, default=0.995)
    metrics = sub.add_parser("metrics", help="write the release's Prometheus metric table")
    metrics.add_argument("--release", required=True, choices=RELEASES)
    metrics.add_argument("--out", required=True)
    metrics.add_argument(
        "--source", help="a vllm package folder (default: the installed one, not imported)"
    )
    serve = sub.add_parser(
        "serve-check",
        help="the pack against the release's create_engine_config on seeded vllm serve lines",
    )
    serve.add_argument("--release", required=True, choices=RELEASES)
    serve.add_argument("--seed", type=int, required=True)
    serve.add_argument("--count", type=int, required=True)
    serve.add_argument("--pack", help="pack name or folder (default vllm-<release>)")
    serve.add_argument("--models", default=".referee/models", help="model folders (written)")
    serve.add_argument("--out", help="write the mismatches here (JSON lines)")
    serve.add_argument("--show", type=int, default=15, help="mismatch classes to report")
    serve.add_argument(
        "--coverage", help="also measure vLLM's branches (referee/branches.py); JSON report here"
    )
    cmark = sub.add_parser(
        "coverage-doc", help="docs/referee-coverage.md from serve-check --coverage reports"
    )
    cmark.add_argument("reports", nargs="+", help="the JSON reports, one per release")
    cmark.add_argument("--out", required=True)
    sgold = sub.add_parser(
        "serve-golden", help="vLLM's create_engine_config answers on seeded vllm serve lines"
    )
    sgold.add_argument("--release", required=True, choices=RELEASES)
    sgold.add_argument("--seed", type=int, required=True)
    sgold.add_argument("--count", type=int, required=True)
    sgold.add_argument("--models", default=".referee/models", help="model folders (written)")
    sgold.add_argument("--out", required=True)
    registry = sub.add_parser("draft-registry", help="the release's registry facts for its pack")
    registry.add_argument("--release", required=True, choices=RELEASES)
    registry.add_argument("--write", action="store_true", help="write them into the pack")
    args = parser.parse_args(argv)
    if args.command in ("serve-check", "serve-golden"):  # before vLLM's CUDA platform loads
        from referee.serve_real import prepare

        prepare()
    if args.command == "coverage-doc":  # reads the reports only
        from referee.branches import markdown

        reports = []
        for path in args.reports:
            try:
                report = json.loads(Path(path).read_text(encoding="utf-8"))
                missing = {"release", "files", "focus"} - set(report)
                if missing:
                    raise ValueError(f"no {', '.join(sorted(missing))}")
            except (OSError, ValueError, TypeError) as exc:
                raise SystemExit(
                    f"referee coverage-doc: {path}: not a serve-check --coverage report ({exc})"
                ) from None
            reports.append(report)
        Path(args.out).write_text(markdown(reports), encoding="utf-8")
        return 0
    if args.command != "metrics":  # reads source only: a wheel unpacked anywhere will do
        _check_installed(args.release)
    return {
        "golden": _golden,
        "check": _check,
        "case": _case,
        "facts": _facts,
        "flags": _flags,
        "flags-recipes": _flags_recipes,
        "flags-check": _flags_check,
        "metrics": _metrics,
        "serve-check": _serve_check,
        "serve-golden": _serve_golden,
        "draft-registry": _draft_registry,
    }[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
