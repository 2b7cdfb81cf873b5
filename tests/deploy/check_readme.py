#!/usr/bin/env python3
"""The README's and the guides' command lines run as written: every glm-server, glm-client and
glm-run command in a ```sh block of README.md, docs/api.md and docs/operations.md (and every
flag of the README's server flag table) names only flags the binary has, and glm-client only
its commands. Flags are what each binary's --help lists.

    check_readme.py --root REPO --server BIN --client BIN --run BIN
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402

DOCS = ["README.md", "docs/api.md", "docs/operations.md"]
CLIENT_COMMANDS = {"info", "generate", "chat", "tokenize", "detokenize", "forward", "close-session",
                   "health", "bench"}
GENERAL = {"help", "version", "helpfull"}


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} --help exited {out.returncode}")
    return set(re.findall(r"^  --(\w+)", out.stdout, re.M)) | GENERAL


def shell_commands(text):
    """Logical lines of ```sh blocks (backslash continuations joined, comments dropped)."""
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                yield line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--run", required=True)
    a = ap.parse_args()
    f = dl.Failures()
    flags = {"glm-server": help_flags(a.server), "glm-client": help_flags(a.client),
             "glm-run": help_flags(a.run)}
    checked = 0
    for doc in DOCS:
        text = open(os.path.join(a.root, doc)).read()
        for line in shell_commands(text):
            # A pipeline or a sequence: check each command of it.
            for part in re.split(r"\s*(?:\||&&|;)\s*", line):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                if not words:
                    continue
                program = os.path.basename(words[0])
                if program not in flags:
                    continue
                checked += 1
                positional = []
                for w in words[1:]:
                    if w.startswith("--"):
                        name = w[2:].split("=")[0]
                        # Abseil's --noflag form of a boolean --flag.
                        known = name in flags[program] or (
                            name.startswith("no") and name[2:] in flags[program])
                        f.check(known, f"{doc}: `{part}`: {program} has no --{name}")
                    elif not w.startswith("-") and not w.startswith("&"):
                        positional.append(w)
                if program == "glm-client":
                    f.check(len(positional) <= 1 and all(p in CLIENT_COMMANDS for p in positional),
                            f"{doc}: `{part}`: glm-client command {positional} is not one of {sorted(CLIENT_COMMANDS)}")
                else:
                    f.check(not positional, f"{doc}: `{part}`: {program} takes no arguments, got {positional}")
        if doc == "README.md":
            # The server flag table: | `--a` / `--b` | default | ... |
            for row in re.findall(r"^\| (`--.*?) \|", text, re.M):
                for name in re.findall(r"`--(\w+)`", row):
                    checked += 1
                    f.check(name in flags["glm-server"], f"README.md flag table: glm-server has no --{name}")
    f.check(checked >= 30, f"expected the docs' command lines, checked only {checked}")
    print(f"checked {checked} command lines and flags")
    return f.finish("check_readme")


if __name__ == "__main__":
    sys.exit(main())
