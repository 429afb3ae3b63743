"""Input files that are not what they claim (bytes that are not UTF-8, JSON indented with tabs,
invalid JSON that YAML would accept, a malformed vLLM --config file): each is refused alone with
file:line:column, or read as the format says; none crashes the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turnout.oracle import ConfigError, PackError, from_command, from_hf_config, load_pack
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack import POLICIES_DIR
from turnout.oracle.sources.spec import load_specs

ROOT = Path(__file__).resolve().parents[2]


def turnout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_spec_with_a_byte_that_is_not_utf8_names_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "spec.yaml"
    f.write_bytes(b"architecture: LlamaForCausalLM\nmodel: ab\xffc\n")
    with pytest.raises(ConfigError) as info:
        load_specs(f)
    assert info.value.code == ErrorCode.BAD_SPEC
    assert f"{f}:2:10:" in info.value.message and "0xff is not UTF-8" in info.value.message


def test_unreadable_spec_with_json_prints_one_contract_object(tmp_path: Path) -> None:
    f = tmp_path / "spec.yaml"
    f.write_bytes(b"\xff\xfe garbage")
    r = turnout("decide", "--spec", str(f), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (out,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert out["runner"] is None and out["error_code"] == ErrorCode.BAD_SPEC
    assert out["error"].startswith(f"{f}:1:1:") and len(out["policy_digest"]) == 16
    r = turnout("decide", "--spec", str(tmp_path / "spec.yml"), "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error_code"] == ErrorCode.FILE_NOT_FOUND


def test_json_spec_indented_with_tabs_is_json(tmp_path: Path) -> None:
    f = tmp_path / "spec.json"
    f.write_text('{\n\t"architecture": "LlamaForCausalLM",\n\t"tensor_parallel_size": 2\n}\n')
    (entry,) = load_specs(f)
    assert entry.error is None and entry.config is not None
    assert entry.config.tensor_parallel_size == 2
    f.write_text('{\n\t"architecture": "LlamaForCausalLM",\n\t"tensor_parallel_sizee": 2\n}\n')
    (entry,) = load_specs(f)
    assert entry.error is not None and entry.error.startswith(f"{f}:3:2: unknown field")


def test_json_spec_is_strict_json(tmp_path: Path) -> None:
    f = tmp_path / "spec.json"
    f.write_text('{"architecture": "LlamaForCausalLM",\n "tensor_parallel_size": 2,}\n')
    with pytest.raises(ConfigError) as info:
        load_specs(f)
    assert f"{f}:2:28: error: invalid JSON" in info.value.message
    f.write_text('{"architecture": "LlamaForCausalLM", "architecture": "Qwen3ForCausalLM"}')
    with pytest.raises(ConfigError) as info:
        load_specs(f)
    assert "duplicate key 'architecture'" in info.value.message


def test_jsonl_bad_bytes_reject_one_line_and_u2028_ends_no_line(tmp_path: Path) -> None:
    f = tmp_path / "specs.jsonl"
    f.write_bytes(
        b'{"id": "a", "architecture": "LlamaForCausalLM"}\n'
        b'{"id": "b", "architecture": "Llama\xc0ForCausalLM"}\n'
        + '{"id": "c", "architecture": "Qwen3ForCausalLM", "model": "x\u2028y"}\n'.encode()
    )
    a, b, c = load_specs(f)
    assert a.config is not None and c.config is not None and c.config.model == "x\u2028y"
    assert b.config is None and b.error is not None
    assert b.error.startswith(f"{f}:2:35: byte 0xc0 is not UTF-8")


def test_commands_file_bad_bytes_reject_one_line(tmp_path: Path) -> None:
    f = tmp_path / "cmds.jsonl"
    good = json.dumps({"id": "ok", "env": {}, "argv": ["vllm", "serve", "Qwen/Qwen3-8B"]})
    f.write_bytes(
        good.encode()
        + b'\n{"id": "bad", "argv": ["vllm", "serve", "\xff"]}\n'
        + good.replace('"ok"', '"ok2"').encode()
        + b"\n"
    )
    r = turnout("decide", "--commands", str(f), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    ok, bad, ok2 = (json.loads(x) for x in r.stdout.splitlines())
    assert ok["runner"] == ok2["runner"] == "v2" and ok2["id"] == "ok2"
    assert bad["runner"] is None and bad["error"].startswith(f"{f}:2:")
    assert "not UTF-8" in bad["error"]


def test_malformed_vllm_config_file_is_a_bad_flag_value(tmp_path: Path) -> None:
    f = tmp_path / "serve.yaml"
    f.write_text("tensor-parallel-size: 2\nspeculative-config: {method: [ngram\n")
    with pytest.raises(ConfigError) as info:
        from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(f)])
    assert info.value.code == ErrorCode.BAD_FLAG_VALUE
    assert f"--config {f}:3:1:" in info.value.message
    f.write_bytes(b"tensor-parallel-size: \xff\n")
    with pytest.raises(ConfigError) as info:
        from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(f)])
    assert f"--config {f}:1:23:" in info.value.message
    f.write_text("tensor-parallel-size: 2\ntensor-parallel-size: 4\n")
    # vLLM reads the file with yaml.safe_load: a repeated key keeps its last value
    cfg = from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(f)])
    assert cfg.tensor_parallel_size == 4


def test_hf_config_not_utf8_is_refused_and_a_bom_is_read(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_bytes(b'{"architectures": ["Llama\xffForCausalLM"]}')
    with pytest.raises(ConfigError) as info:
        from_hf_config(f)
    assert info.value.code == ErrorCode.BAD_SPEC and f"{f}:1:26:" in info.value.message
    f.write_bytes(b'\xef\xbb\xbf{"architectures": ["LlamaForCausalLM"]}')
    assert from_hf_config(f).architecture == "LlamaForCausalLM"


def test_pack_file_not_utf8_is_a_pack_error(tmp_path: Path) -> None:
    dest = tmp_path / "pack"
    shutil.copytree(POLICIES_DIR / "turnout", dest)
    ro = dest / "rollout.yaml"
    ro.write_bytes(ro.read_bytes().replace(b"stages:", b"stages:\xfe", 1))
    with pytest.raises(PackError) as info:
        load_pack(dest)
    (issue,) = info.value.issues
    assert issue.file == str(ro) and issue.column == 8 and "0xfe is not UTF-8" in issue.message
    r = turnout("lint", str(dest))
    assert r.returncode == 1 and "Traceback" not in r.stderr and f"{ro}:" in r.stdout


@pytest.mark.parametrize(
    "snapshot",
    [
        {"kill_switch": "false"},
        {"cohorts": {"qwen3-canary": {"enabled": "false"}}},
        {"cohorts": {"qwen3-canary": {"enabled": True, "percentage": "50"}}},
        {"cohorts": {"qwen3-canary": {"enabled": True, "percentage": 50.5}}},
    ],
)
def test_canary_file_with_wrong_types_is_bad_input(
    tmp_path: Path, snapshot: dict[str, object]
) -> None:
    f = tmp_path / "canaries.json"
    f.write_text(json.dumps(snapshot))
    r = turnout("decide", "--json", "--canaries", str(f), "--architecture", "Qwen3ForCausalLM")
    assert r.returncode == 2, r.stdout  # not "false" read as true (kill switch engaged)
    assert json.loads(r.stdout)["error_code"] == ErrorCode.BAD_SPEC


@pytest.mark.parametrize(
    "snapshot",
    [
        {"pack": "turnout", "kill_switch": {"engaged": "no"}, "cohorts": []},
        {
            "pack": "turnout",
            "kill_switch": {"engaged": False},
            "cohorts": [{"cohort": "qwen3-canary", "enabled": True}],
        },
        {"cohorts": ["qwen3-canary"]},
        {"cohorts": "qwen3-canary"},
        {"cohorts": {"qwen3-canary": True}},
        ["qwen3-canary"],
    ],
)
def test_canary_file_in_neither_shape_names_both(tmp_path: Path, snapshot: object) -> None:
    # A GET /api/v1/canaries body or a wrong shape gave "not a canary snapshot (dictionary
    # update sequence element #0 has length 8; 2 is required)".
    f = tmp_path / "canaries.json"
    f.write_text(json.dumps(snapshot))
    r = turnout("decide", "--canaries", str(f), "--architecture", "Qwen3ForCausalLM")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    out = " ".join((r.stdout + r.stderr).split())
    assert f"{f}: not a canary snapshot: " in out and "body of GET /api/v1/canaries" in out
    assert "dictionary update" not in out


def test_canary_file_cohorts_the_pack_lacks_are_named_not_dropped(tmp_path: Path) -> None:
    f = tmp_path / "canaries.json"
    f.write_text(
        json.dumps(
            {
                "kill_switch": False,
                "cohorts": {
                    "qwen3-canary": {"enabled": False, "percentage": 0},
                    "retired-stage": {"enabled": True, "percentage": 100},
                },
            }
        )
    )
    r = turnout("decide", "--canaries", str(f), "--architecture", "Qwen3ForCausalLM")
    assert r.returncode == 0 and "runner V1" in r.stdout
    want = (
        f"canaries: {f} (kill switch off; stages on: none; not in pack turnout, not used: "
        "retired-stage)"
    )
    assert "".join(want.split()) in "".join(r.stdout.split())  # wrapped at COLUMNS or not


def test_unicode_digit_and_infinity_on_a_command_line_are_bad_values() -> None:
    r = turnout("decide", "--json", "--", "vllm", "serve", "Qwen/Qwen3-8B", "-tp", "²")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # int("²") fails: vLLM's parser refuses it, in argparse's words
    got = json.loads(r.stdout)
    assert got["error_code"] == ErrorCode.BAD_FLAG_VALUE
    assert got["error"].startswith("argument --tensor-parallel-size/-tp: invalid int value: '²'")
    r = turnout(
        "decide", "--json", "--", "vllm", "serve", "Qwen/Qwen3-8B", "--cpu-offload-gb", "inf"
    )
    assert r.returncode == 2 and "Infinity" not in r.stdout
    # float("inf") passes vLLM's parser; the config refuses it
    assert json.loads(r.stdout)["error"] == "cpu_offload_gb: expected a finite number, got inf"


BOMB = "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
    for p, n in zip(["", *"abcdefg"], "abcdefgh", strict=False)
)


def test_alias_bomb_is_refused_quickly_and_aliases_still_work(tmp_path: Path) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB)  # 9**8 values once expanded; refused after 100,000
    with pytest.raises(ConfigError) as info:
        load_specs(f)
    assert "repeated through aliases" in info.value.message
    f.write_text(
        "deployments:\n  - &base {architecture: LlamaForCausalLM, "
        "tensor_parallel_size: 2}\n  - *base\n"
    )
    assert [e.config.tensor_parallel_size for e in load_specs(f) if e.config] == [2, 2]


def test_alias_bomb_in_a_pack_file_is_a_pack_error(tmp_path: Path) -> None:
    dest = tmp_path / "pack"
    shutil.copytree(POLICIES_DIR / "turnout", dest)
    (dest / "rollout.yaml").write_text(BOMB)
    with pytest.raises(PackError) as info:
        load_pack(dest)
    assert "repeated through aliases" in str(info.value)


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML document: 9 levels of 9 aliases each (382 bytes; 9**9 values)."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_as_a_vllm_config_file_is_refused(tmp_path: Path) -> None:
    # Before: `turnout decide -- vllm serve ... --config bomb.yaml` grew ~90 MB/s without bound.
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    with pytest.raises(ConfigError) as info:
        from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(bomb)])
    assert info.value.code == ErrorCode.BAD_FLAG_VALUE
    assert "holds more than 100000 values, counting each alias" in info.value.message
    deep = tmp_path / "deep.yaml"
    deep.write_text("max_num_seqs: 8\nx: " + "[" * 2000 + "]" * 2000 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(deep)])
    fine = tmp_path / "fine.yaml"
    fine.write_text("max-num-seqs: &n 16\nseed: *n\n")  # an alias is still fine
    assert from_command(["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(fine)]) is not None


@pytest.mark.parametrize(
    "flag",
    [
        ["decide", "--spec"],
        ["decide", "--commands"],
        ["decide", "--architecture", "Qwen3ForCausalLM", "--canaries"],
    ],
    ids=["spec", "commands", "canaries"],
)
@pytest.mark.parametrize("kind", ["device", "fifo", "huge", "deep"])
def test_file_flags_refuse_devices_fifos_huge_and_deep_files(
    tmp_path: Path, flag: list[str], kind: str
) -> None:
    # Before: /dev/zero was read until MemoryError, a FIFO blocked for ever, and a file nested
    # 20,000 deep ended in a RecursionError traceback.
    if kind == "device":
        path, says = Path("/dev/zero"), "a device, not a regular file"
    elif kind == "fifo":
        path, says = tmp_path / "fifo", "a FIFO, not a regular file"
        os.mkfifo(path)
    elif kind == "huge":
        path, says = tmp_path / "huge.json", "larger than 16,777,216 bytes"
        with path.open("wb") as f:
            f.truncate(17 << 20)
    else:
        path, says = tmp_path / "deep.json", "nested 20000 levels deep"
        path.write_text("[" * 20_000 + "]" * 20_000)
    r = turnout(*flag, str(path), "--json")
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    if kind == "deep" and flag[1] == "--commands":
        # A commands file is lines: the one line is refused alone, as any line that is no
        # vllm serve command (and nothing recursed).
        [row] = [json.loads(line) for line in r.stdout.splitlines()]
        assert row["error_code"] == "bad_command", row
        return
    assert says in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    assert r.returncode == 2, (r.stdout + r.stderr)[-2000:]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 3000 + "]" * 3000 + "\n", "nested deeper than 64 levels"),
        ("a: &a [*a]\n", "an alias refers to the node that holds it"),
    ],
    ids=["deep", "alias-of-itself"],
)
def test_a_yaml_spec_too_deep_or_holding_itself_is_a_bad_spec(
    tmp_path: Path, text: str, says: str
) -> None:
    # Before: a RecursionError traceback (PyYAML's composer, or the positions walker).
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_specs(spec)
    assert info.value.code == ErrorCode.BAD_SPEC and says in info.value.message
    r = turnout("decide", "--spec", str(spec))
    assert r.returncode == 2 and says in r.stdout + r.stderr and "Traceback" not in r.stderr
