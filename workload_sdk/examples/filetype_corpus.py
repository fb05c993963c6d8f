"""A deterministic corpus of small files of many types, for the file-type examples.

``corpus(n, seed)`` returns ``n`` byte strings built from fragments of source code, configs,
markup, data and prose, cut at different lengths and sometimes mixed (a shell script with an
embedded JSON, a Markdown file with a code block): the short, mixed files are where file-type
models are least sure, so two models (or two versions of one) disagree on some of them. The same
``(n, seed)`` always gives the same bytes; used by ``docs/model-changes.md``'s real case and its
integration test.
"""

from __future__ import annotations

import random

__all__ = ["FRAGMENTS", "corpus"]

FRAGMENTS: dict[str, list[str]] = {
    "python": [
        "import os\nimport sys\n\n\ndef main() -> int:\n    print(os.getcwd())\n    return 0\n\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n",
        "class Gate:\n    def __init__(self, name):\n        self.name = name\n        self.open = "
        "False\n\n    def toggle(self):\n        self.open = not self.open\n",
        "for i in range(10):\n    if i % 2:\n        continue\n    print(i)\n",
    ],
    "javascript": [
        "const express = require('express');\nconst app = express();\napp.get('/', (req, res) => "
        "res.send('ok'));\napp.listen(3000);\n",
        "function add(a, b) {\n  return a + b;\n}\nmodule.exports = { add };\n",
        "document.querySelectorAll('.item').forEach(el => {\n  el.addEventListener('click', () "
        "=> el.classList.toggle('on'));\n});\n",
    ],
    "c": [
        "#include <stdio.h>\n\nint main(void) {\n    printf(\"hello\\n\");\n    return 0;\n}\n",
        "static int sum(const int *a, size_t n) {\n    int s = 0;\n    for (size_t i = 0; i < n; "
        "i++) s += a[i];\n    return s;\n}\n",
    ],
    "rust": [
        "fn main() {\n    let v: Vec<u32> = (1..10).collect();\n    println!(\"{:?}\", v);\n}\n",
        "pub struct Valve { pub open: bool }\nimpl Valve {\n    pub fn set(&mut self, o: bool) "
        "{ self.open = o; }\n}\n",
    ],
    "go": [
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
    ],
    "java": [
        "public class Main {\n    public static void main(String[] args) {\n        System.out."
        "println(\"hi\");\n    }\n}\n",
    ],
    "shell": [
        "#!/bin/sh\nset -e\nfor f in *.log; do\n  gzip \"$f\"\ndone\necho done\n",
        "export PATH=$HOME/bin:$PATH\nalias ll='ls -la'\n",
    ],
    "sql": [
        "SELECT id, name FROM users WHERE active = 1 ORDER BY name;\n",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);\nINSERT INTO t VALUES (1, "
        "'a');\n",
    ],
    "html": [
        "<!DOCTYPE html>\n<html>\n<head><title>Gate</title></head>\n<body><p>open</p></body>\n"
        "</html>\n",
        "<div class=\"card\"><h2>Status</h2><span>ok</span></div>\n",
    ],
    "css": ["body { margin: 0; font-family: sans-serif; }\n.card { padding: 1em; }\n"],
    "json": [
        "{\"id\": 7, \"name\": \"valve-3\", \"open\": false, \"tags\": [\"a\", \"b\"]}\n",
        "[{\"t\": 1, \"v\": 0.5}, {\"t\": 2, \"v\": 0.7}]\n",
    ],
    "yaml": [
        "name: gate\nreplicas: 2\nports:\n  - 8080\n  - 9090\nenv:\n  MODE: strict\n",
    ],
    "toml": ["[package]\nname = \"gate\"\nversion = \"0.1.0\"\n\n[dependencies]\nserde = \"1\"\n"],
    "ini": ["[server]\nhost = 0.0.0.0\nport = 8080\n\n[log]\nlevel = info\n"],
    "xml": ["<?xml version=\"1.0\"?>\n<config><gate id=\"3\" open=\"false\"/></config>\n"],
    "csv": ["time,sensor,value\n1,a,0.5\n2,a,0.7\n3,b,1.2\n", "id;name;qty\n1;bolt;40\n2;nut;12\n"],
    "markdown": [
        "# Gate\n\nThe gate opens for **allowed** types.\n\n- pdf\n- png\n",
        "## Notes\n\nSee [the docs](http://example.com) and `fx why`.\n",
    ],
    "txt": [
        "The quick brown fox jumps over the lazy dog. ",
        "Meeting moved to Thursday at ten; bring the valve report.\n",
        "lorem ipsum dolor sit amet, consectetur adipiscing elit\n",
    ],
    "makefile": ["all: build\n\nbuild:\n\tgcc -o app main.c\n\nclean:\n\trm -f app\n"],
    "dockerfile": ["FROM debian:bookworm\nRUN apt-get update\nCOPY . /app\nCMD [\"/app/run\"]\n"],
    "php": ["<?php\n$x = 3;\necho \"x is $x\";\n?>\n"],
    "ruby": ["def greet(name)\n  puts \"hello #{name}\"\nend\n\ngreet('gate')\n"],
}


def corpus(n: int, seed: int = 1) -> list[bytes]:
    """``n`` files: a fragment of one type, cut to a random length (sometimes very short), or two
    fragments of different types joined, or a fragment repeated."""
    rng = random.Random(seed)
    kinds = sorted(FRAGMENTS)
    out: list[bytes] = []
    for _ in range(n):
        kind = rng.choice(kinds)
        text = rng.choice(FRAGMENTS[kind])
        shape = rng.random()
        if shape < 0.35:  # cut short
            text = text[: rng.randint(8, max(9, len(text)))]
        elif shape < 0.6:  # two types mixed
            other = rng.choice(FRAGMENTS[rng.choice(kinds)])
            text = text + "\n" + other[: rng.randint(10, len(other))]
        elif shape < 0.75:  # repeated
            text = text * rng.randint(2, 6)
        out.append(text.encode())
    return out
