"""The strict-grammar checks of tests/unit/engine/test_json_grammar.py, run by another environment's
python (the vLLM thinker's, with its own xgrammar): `python -m tests.json_grammar_check` reads
{"schemas": [{"schema", "taken", "refused"}], "tags": [{"tag", "schema", "taken", "refused"}]} on
stdin and writes {"xgrammar", "problems", "walks", "ended"} on stdout. Each schema's strict grammar
(omnistream/engine/json_grammar.py) must take the texts `taken` and refuse those `refused`, and
every text of random walks through it must be strict compact JSON that validates once it ends;
each tool call tag likewise for whole calls (their arguments against `schema`)."""

from __future__ import annotations

import importlib.metadata
import json
import sys

import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from omnistream.engine.json_grammar import json_schema_ebnf, strict_structural_tag
from tests.json_schemas import answer_problems, byte_tokenizer, byte_walks


def main() -> None:
    request = json.load(sys.stdin)
    compiler = xgr.GrammarCompiler(byte_tokenizer(), max_threads=1)
    problems: list[str] = []
    walks = ended_walks = 0
    for i, case in enumerate(request["schemas"]):
        ebnf = json_schema_ebnf(case["schema"])
        grammar = xgr.Grammar.from_ebnf(ebnf)
        problems += [
            f"{i}: not taken: {t!r}" for t in case["taken"] if not _is_grammar_accept_string(grammar, t)
        ]
        problems += [f"{i}: taken: {t!r}" for t in case["refused"] if _is_grammar_accept_string(grammar, t)]
        for raw, ended in byte_walks(compiler.compile_grammar(ebnf), seed=i, walks=4):
            walks += 1
            ended_walks += ended
            problems += [f"{i}: {p}" for p in answer_problems(raw, ended, case["schema"])]
    for i, case in enumerate(request["tags"]):
        spec = strict_structural_tag(case["tag"])
        grammar = xgr.Grammar.from_structural_tag(spec)
        problems += [
            f"tag {i}: not taken: {t!r}" for t in case["taken"] if not _is_grammar_accept_string(grammar, t)
        ]
        problems += [
            f"tag {i}: taken: {t!r}" for t in case["refused"] if _is_grammar_accept_string(grammar, t)
        ]
        for raw, ended in byte_walks(compiler.compile_structural_tag(spec), seed=i, walks=8, limit=400):
            text = raw.decode("utf-8", "replace")
            if ended:  # the arguments: between the call's begin and end
                arguments = text.split('"arguments": ', 1)[1].rsplit("}\n</tool_call>", 1)[0]
                problems += [
                    f"tag {i}: {p}" for p in answer_problems(arguments.encode(), True, case["schema"])
                ]
    json.dump(
        {
            "xgrammar": importlib.metadata.version("xgrammar"),
            "problems": problems,
            "walks": walks,
            "ended": ended_walks,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
