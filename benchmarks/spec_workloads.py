"""The prompts of bench_spec.py (its docstring describes them), as token ids of the default
model: text from data/python_docs.txt and source files of this repository (functions found by
name with `ast`, so they follow the code as it changes), chat turns through the model's own
chat template."""

from __future__ import annotations

import ast
import pathlib


def _function(path: pathlib.Path, name: str) -> str:
    """The source of the top-level function `name` in `path`."""
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise SystemExit(f"{path} has no function {name!r}")


def _copy(text: str) -> str:
    return f"Repeat the following text exactly.\n\n{text}\n\nRepeated text:\n{text[:200]}"


def single_prompts(llm, root: pathlib.Path) -> dict[str, list[int]]:
    docs = (root / "data" / "python_docs.txt").read_text()
    function = _function(root / "infergen" / "engine" / "backlog.py", "seconds_until_admitted")
    edit = [
        {"role": "user", "content": "Rename the variable `held` to `blocks_held` in this "
         f"function and show the whole function.\n\n```python\n{function}\n```"},
    ]  # fmt: skip
    module = root / "infergen" / "engine" / "spec" / "acceptance.py"
    agentic = [
        {"role": "system", "content": "You are a coding agent. Call tools to read files."},
        {"role": "user", "content": "What does Acceptance.rate return? Show me its code."},
        {"role": "assistant", "content": '<tool_call>{"name": "read_file", "arguments": '
         '{"path": "infergen/engine/spec/acceptance.py"}}</tool_call>'},
        {"role": "user", "content": f"<tool_response>\n{module.read_text()}\n</tool_response>"},
        {"role": "user", "content": "Print the method `rate` exactly as it is in the file."},
    ]  # fmt: skip
    return {
        "copy": llm.engine.encode(_copy(docs[20000:21200])),
        "edit": llm.chat_prompt(edit),
        "agentic": llm.chat_prompt(agentic),
        "open": llm.engine.encode(docs[40000:41200]),
    }


def batch_prompts(llm, root: pathlib.Path, n: int) -> dict[str, list[list[int]]]:
    """`n` copy prompts and `n` open ones, each on its own passage."""
    docs = (root / "data" / "python_docs.txt").read_text()
    at = [50000 + 1500 * i for i in range(n)]
    return {
        "copy": [llm.engine.encode(_copy(docs[a : a + 1000])) for a in at],
        "open": [llm.engine.encode(docs[a + 30000 : a + 31000]) for a in at],
    }


def completion_prompts(llm, root: pathlib.Path) -> dict[str, list[int]]:
    """The copy-heavy batch-1 workloads for a base model (no chat template: Gemma-3-270M),
    as the text a completion continues:

    edit     the function of `single_prompts`' edit, a comment asking for one variable
             renamed, and the edited function's first two lines: the continuation is the
             rest of the function with the change (the first 128 tokens come before the
             renamed variable: what an edit's output mostly is, a copy);
    agentic  a shell session, the agent's tool use: `cat` of a module, then `sed` printing
             one class of it, whose first line is given: the continuation echoes the
             tool's earlier output."""
    function = _function(root / "infergen" / "engine" / "backlog.py", "seconds_until_admitted")
    head = "\n".join(function.split("\n")[:2])
    path = "infergen/engine/spec/acceptance.py"
    module = (root / path).read_text()
    edit = (
        f"# infergen/engine/backlog.py, before:\n{function}\n\n"
        f"# after renaming `held` to `blocks_held`:\n{head}\n"
    )
    agentic = (
        f"$ cat {path}\n{module}\n$ sed -n '/^class Acceptance/,$p' {path}\nclass Acceptance:\n"
    )
    return {"edit": llm.engine.encode(edit), "agentic": llm.engine.encode(agentic)}
