"""Seeded ``vllm serve`` command lines drawn from a release's flag table.

Each line is ``vllm serve MODEL`` and one to six flags of the table (the ones the decision
reads drawn more often), spelt the ways people spell them (long names, short aliases,
underscores, ``=`` forms, unique and ambiguous prefixes, negated switches, dotted JSON keys)
with good values and bad ones (a word for an int, an environment variable, a choice that is
not one, invalid JSON, an unknown or mistyped key of a config class, a switch given a value),
and now and then a flag the release does not have, ``-O3``, a second model, a missing value, a
``--config`` file. The same ``(seed, table)`` always gives the same lines. Pure standard
library: the lines are made without vLLM, and checked against it by
:mod:`referee.flags_check`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from turnout.oracle.sources.command_fields import DERIVED, DIRECT

MODELS = ("Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "org/model")
BAD_WORDS = ("two", "$MASTER_PORT", "1.5", "", "None", "16k", "-1", "auto", "true", "<N>")
UNKNOWN_FLAGS = (
    "--not-a-flag",
    "--tensor-paralel-size",
    "--disable-log-requests",
    "--task",
    "--omni",
    "-x",
)
CONFIG_FILE = "flags-check.yaml"


class _Gen:
    def __init__(self, table: dict[str, Any], rng: random.Random) -> None:
        self.t, self.rng = table, rng
        self.actions = [
            a for a in table["actions"] if a["option_strings"] and a["action"] != "help"
        ]
        self.options = sorted(o for a in self.actions for o in a["option_strings"])
        mapped = set(DIRECT) | set(DERIVED)
        self.weights = [8 if a["dest"] in mapped else 1 for a in self.actions]

    # -- spellings -------------------------------------------------------------------------

    def spell(self, action: dict[str, Any]) -> str:
        opts = [
            o
            for o in action["option_strings"]
            if not o.startswith("--no-") and not o.startswith("--disable-")
        ] or action["option_strings"]
        name = self.rng.choice(opts)
        roll = self.rng.random()
        if roll < 0.15 and name.startswith("--"):
            return "--" + name[2:].replace("-", "_")
        if roll < 0.3 and name.startswith("--") and len(name) > 6:
            return name[: self.rng.randint(4, len(name) - 1)]  # a prefix: unique or ambiguous
        return name

    # -- values ------------------------------------------------------------------------------

    def scalar(self, kind: str, choices: list[Any] | None) -> str:
        rng = self.rng
        if choices:
            pick = rng.choice([c for c in choices if c is not None] or ["x"])
            return str(pick).upper() if rng.random() < 0.1 else str(pick)
        if rng.random() < 0.15:
            return rng.choice(BAD_WORDS)
        base = kind.removeprefix("optional(").removesuffix(")")
        if "int" in base:
            return rng.choice(("1", "2", "4", "8", "16k", "2K", "0", "1.5K"))
        if base == "float":
            return rng.choice(("0.5", "0.9", "2", "1e-3", "x"))
        if "json" in base or base == "union_dict_and_str":
            return rng.choice(
                (
                    '{"a": 1}',
                    '{"architectures": ["LlamaForCausalLM"]}',
                    "{bad",
                    "[1, 2]",
                    '{"enable_thinking": false}',
                )
            )
        return rng.choice(("foo", "bar-1", "a,b", "auto"))

    def descriptor_value(self, desc: dict[str, Any], depth: int = 0) -> Any:
        rng, t = self.rng, desc["t"]
        if rng.random() < 0.08:
            return rng.choice(("x", 3, None, [1], {"k": 1}, True))  # often the wrong type
        if t == "int":
            return rng.choice((1, 2, 8, "4", 0))
        if t == "float":
            return rng.choice((0.5, 1, "0.25"))
        if t == "bool":
            return rng.choice((True, False, "true", 1))
        if t in ("str", "path"):
            return rng.choice(("x", "/tmp/x", "auto"))
        if t == "literal":
            return rng.choice(desc["values"])
        if t == "enum":
            enum = self.t["enums"][desc["name"]]
            i = rng.randrange(len(enum["names"]))
            return rng.choice((enum["names"][i], enum["names"][i].lower(), enum["values"][i]))
        if t == "list":
            return [
                self.descriptor_value(desc["item"], depth + 1) for _ in range(rng.randint(0, 2))
            ]
        if t == "dict":
            return {"k": self.descriptor_value(desc["value"], depth + 1)}
        if t == "union":
            return self.descriptor_value(rng.choice(desc["of"]), depth)
        if t == "config" and depth < 2:
            return self.config_value(desc["name"], depth + 1)
        return None

    def config_value(self, name: str, depth: int = 0) -> dict[str, Any]:
        fields = self.t["configs"][name]["fields"]
        names = list(fields)
        out: dict[str, Any] = {}
        for key in self.rng.sample(names, min(len(names), self.rng.randint(0, 2))):
            out[key] = self.descriptor_value(fields[key]["type"], depth)
        if self.rng.random() < 0.15:
            out["not_a_key"] = 1
        return out

    def json_flag(self, action: dict[str, Any], name: str) -> list[str]:
        config = self.t["json_flags"][action["dest"]]["config"]
        value = self.config_value(config)
        if value and self.rng.random() < 0.3:  # dotted keys, one word each
            out: list[str] = []
            for key, item in value.items():
                text = item if isinstance(item, str) else json.dumps(item)
                out += (
                    [f"{name}.{key}={text}"] if self.rng.random() < 0.5 else [f"{name}.{key}", text]
                )
            return out
        text = json.dumps(value)
        if self.rng.random() < 0.07:
            text = text[:-1]  # invalid JSON
        return [name, text]

    def flag(self, action: dict[str, Any]) -> list[str]:
        name, rng = self.spell(action), self.rng
        if action["action"] in ("BooleanOptionalAction", "EnableDisableAction", "store_true"):
            negative = action.get("negative") or []
            if negative and rng.random() < 0.3:
                return [rng.choice(negative)]
            return [f"{name}={rng.choice(('true', '1'))}"] if rng.random() < 0.08 else [name]
        if action["dest"] in self.t["json_flags"]:
            return self.json_flag(action, name)
        if action["nargs"] == "+":
            return [
                name,
                *(
                    self.scalar(action["type"] or "str", action["choices"])
                    for _ in range(rng.randint(1, 3))
                ),
            ]
        if action["nargs"] == "?" and rng.random() < 0.4:
            return [name]
        value = self.scalar(action["type"] or "str", action["choices"])
        if rng.random() < 0.04:
            return [name]  # the value forgotten
        return [f"{name}={value}"] if rng.random() < 0.25 else [name, value]

    # -- lines -------------------------------------------------------------------------------

    def line(self) -> tuple[list[str], str | None]:
        """``(argv, config file text or None)``."""
        rng = self.rng
        words: list[str] = []
        for action in rng.choices(self.actions, self.weights, k=rng.randint(1, 6)):
            words += self.flag(action)
        roll = rng.random()
        if roll < 0.05:
            words.append(rng.choice(UNKNOWN_FLAGS))
        elif roll < 0.08:
            words.append(rng.choice(("-O3", "-O", "-O0", "-O=2")))
        model = rng.choice(MODELS)
        config = None
        if rng.random() < 0.05:
            config = self.config_text()
            words += ["--config", CONFIG_FILE]
        head = (
            [model]
            if rng.random() > 0.05
            else ["--model", model]
            if rng.random() < 0.5
            else [model, "extra"]
        )
        return ["vllm", "serve", *head, *words], config

    def config_text(self) -> str:
        rows = []
        for action in self.rng.choices(self.actions, self.weights, k=self.rng.randint(1, 3)):
            key = action["option_strings"][0].lstrip("-")
            if action["nargs"] == 0:
                rows.append(f"{key}: {self.rng.choice(('true', 'false'))}")
            else:
                rows.append(
                    f"{key}: {json.dumps(self.scalar(action['type'] or 'str', action['choices']))}"
                )
        return "\n".join(rows) + "\n"


def generate(table: dict[str, Any], seed: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` lines ``{"id", "argv", "config_file"}`` for ``table`` (a flags.json)."""
    gen = _Gen(table, random.Random(f"{seed}:{table['release']}"))
    for n in range(count):
        argv, config = gen.line()
        yield {"id": f"flags-{seed}-{n:05d}", "argv": argv, "config_file": config}
