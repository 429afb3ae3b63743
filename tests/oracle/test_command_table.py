"""The `vllm serve` parser rebuilt from each release's flags.json reproduces the release's own.

flags.json records, besides the table, what vLLM's parser made of a set of probe lines (each
behaviour: abbreviations, `-O3`, dotted keys, `--config`, JSON validated by config classes,
...); the oracle's parser must give every probe the same verdict and the same values.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from turnout.oracle import ConfigError, from_command, load_pack
from turnout.oracle.errors import ErrorCode
from turnout.oracle.sources import release_for_pack
from turnout.oracle.sources.command import check_line, command_to_fields
from turnout.oracle.sources.command_argv import REWRITE_DIGESTS
from turnout.oracle.sources.command_parser import serve_parser
from turnout.oracle.sources.command_table import available_releases, load_table, newest_release

RELEASES = available_releases()


def _read(given: dict[str, Any], path: str) -> Any:
    value: Any = given
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_every_release_has_a_table() -> None:
    assert RELEASES == ("0.29", "0.30", "0.31", "0.32", "0.33")
    assert newest_release() == "0.33"


@pytest.mark.parametrize("release", RELEASES)
def test_table_is_one_the_oracle_implements(release: str) -> None:
    table = load_table(release)
    assert table.vllm_version == f"{release}.0"
    assert table.data["parser"]["preprocess_digest"] in REWRITE_DIGESTS
    assert not [a["type"] for a in table.actions if str(a["type"]).startswith("unknown")]
    parser = serve_parser(release)  # every type and action kind is implemented
    assert len(parser.parser._actions) == len(table.actions)


@pytest.mark.parametrize("release", RELEASES)
def test_every_probe_is_read_as_the_release_reads_it(release: str, tmp_path: Path) -> None:
    behaviours = load_table(release).behaviours
    (tmp_path / behaviours["config_file"]["name"]).write_text(behaviours["config_file"]["text"])
    wrong = []
    for probe in behaviours["probes"]:
        given, error = check_line(
            ["vllm", "serve", *probe["argv"]], release=release, base_dir=tmp_path
        )
        if (error is None) != probe["accepted"]:
            wrong.append((probe["note"], probe["error"], error and error.message))
        elif given is not None:
            got = {p: _read(given, p) for p in probe.get("values", {})}
            if got != probe["values"]:
                wrong.append((probe["note"], probe["values"], got))
    assert not wrong, wrong


def test_the_refusal_is_worded_as_vllm_words_it() -> None:
    probes = {p["note"]: p for p in load_table("0.31").behaviours["probes"]}
    for note in (
        "ambiguous prefix",
        "switch given a value",
        "unknown flag",
        "choices",
        "human-readable int with a binary suffix",
        "unknown nested key",
    ):
        _, error = check_line(["vllm", "serve", *probes[note]["argv"]], release="0.31")
        assert error is not None
        first = probes[note]["error"].splitlines()[0].split(" [type=")[0]
        assert error.message.startswith(first), (note, error.message, first)


def test_a_pack_reads_command_lines_with_its_release() -> None:
    assert release_for_pack(load_pack("vllm-0.31")) == "0.31"
    assert release_for_pack(load_pack("turnout")) is None  # the newest table
    line = "vllm serve Qwen/Qwen3-8B -tp 2 --compilation-config.pass_config.enable_sp true"
    assert from_command(line, release="0.31").enable_sequence_parallelism
    with pytest.raises(ConfigError, match=r"pass_config\.enable_sp: Unexpected keyword"):
        from_command(line, release="0.32")  # 0.32 removed the sequence-parallel pass


def test_flags_that_do_not_change_the_decision_are_reported_as_ignored() -> None:
    from turnout.oracle.sources import command_to_fields

    parsed = command_to_fields(
        "vllm serve Qwen/Qwen3-8B --port 8001 --no-enable-log-requests "
        "-tp 2 --served-model-name a b -O3",
        {},
        release="0.31",
    )
    assert parsed.fields["tensor_parallel_size"] == 2 and parsed.release == "0.31"
    assert parsed.ignored == [
        "--port 8001",
        "--no-enable-log-requests",
        "--served-model-name a b",
        "--optimization-level 3",
    ]


def test_config_file_values_and_json_numbers(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text(
        "tensor-parallel-size: 4\nkv-transfer-config:\n"
        "  kv_connector: NixlConnector\n  kv_role: kv_both\n"
        "enable-prefix-caching: false\n"
    )
    cfg = from_command("vllm serve Qwen/Qwen3-8B --config serve.yaml -tp 2", base_dir=tmp_path)
    assert cfg.tensor_parallel_size == 2
    assert dict(cfg.kv_transfer_config or {})["kv_role"] == "kv_both"
    assert cfg.enable_prefix_caching is None  # vLLM drops a false switch of a config file
    cfg = from_command(
        "vllm serve Qwen/Qwen3-8B --kv-transfer-config "
        '\'{"kv_connector": "X", "kv_role": "kv_both", "kv_buffer_size": 2k}\'',
        release="0.31",
    )  # 0.32 dropped kv_buffer_size
    assert dict(cfg.kv_transfer_config or {})["kv_buffer_size"] == 2000


def test_a_placeholder_in_a_string_flag_is_accepted_as_vllm_accepts_it() -> None:
    parsed_ok, error = check_line("vllm serve Qwen/Qwen3-8B --host $HOST")
    assert error is None and parsed_ok == {"model_tag": "Qwen/Qwen3-8B", "host": "$HOST"}
    with pytest.raises(ConfigError) as info:
        from_command("vllm serve Qwen/Qwen3-8B --dtype <DTYPE>")
    assert info.value.code == ErrorCode.PLACEHOLDER_VALUE and info.value.field == "--dtype"


@pytest.mark.parametrize("release", ["0.29", "0.33"])
def test_seeded_lines_are_answered_never_crash(release: str, tmp_path: Path) -> None:
    """The referee's generator of command lines (python -m referee flags-check draws its lines
    from it): every line is accepted or refused with a ConfigError, the same each time."""
    from referee.flags_gen import CONFIG_FILE, generate

    table = load_table(release).data
    cases = list(generate(table, 3, 300))
    assert cases == list(generate(table, 3, 300))
    verdicts = Counter()
    for case in cases:
        if case["config_file"] is not None:
            (tmp_path / CONFIG_FILE).write_text(case["config_file"])
        _, error = check_line(case["argv"], release=release, base_dir=tmp_path)
        verdicts["refused" if error else "accepted"] += 1
    assert verdicts["accepted"] > 60 and verdicts["refused"] > 60, verdicts


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_a_config_file_that_is_no_small_regular_file_is_refused_unread(
    tmp_path: Path, kind: str
) -> None:
    # /dev/zero behind a .yaml name was read until memory ran out; a FIFO blocked forever.
    path = tmp_path / "serve.yaml"
    if kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match=r"not a regular file|bytes; at most") as err:
        command_to_fields(
            ["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(path)], {}, offline=True
        )
    assert err.value.code == ErrorCode.BAD_FLAG_VALUE


@pytest.mark.parametrize(
    "value",
    [
        '{"architectures": "LlamaForCausalLM"}',
        '{"architectures": []}',
        '{"architectures": [1]}',
        "[1]",
        '"x"',
    ],
)
def test_hf_overrides_of_the_wrong_shape_are_refused(value: str) -> None:
    # They were dropped silently and the model's own architecture decided.
    with pytest.raises(ConfigError, match="--hf-overrides") as err:
        command_to_fields(
            ["vllm", "serve", "Qwen/Qwen3-8B", "--hf-overrides", value], {}, offline=True
        )
    assert err.value.code == ErrorCode.BAD_FLAG_VALUE
