"""Requirement lines: what a job's `requirements:` may hold, one rule for the list and the file form.

The environment build (services/controller/pyenv.py) runs the installer on
the host with the platform's file and network access, so a line is a
package name and nothing else: a line that is an installer option (`-r
/host/file`, `-c`, `-e`, `--find-links /host/dir`, `--index-url`, ...), a
local path or `file:` URL, a URL of any kind (packages come from the index
the platform's admin configured), a `${VARIABLE}` (the installer expands
those from its own environment) or a line continuation is refused. The
refusal names the source (the file or the manifest's list), the line or
entry number and the rule; it never repeats the line's text, so what it
says cannot come from outside the job.

The API checks the list form when it validates the manifest and the file
form when the uploaded code archive holds the file; the controller checks
both again before every build.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_REQUIREMENTS = 200
MAX_LINE = 1000
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_EXTRAS = rf"\[\s*(?:{_NAME}(?:\s*,\s*{_NAME})*)?\s*\]"
_CLAUSE = r"(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_SPECS = rf"{_CLAUSE}(?:\s*,\s*{_CLAUSE})*"
# A PEP 508 marker, in the characters markers are made of (never `$`, `@`, `/`, `\`).
_MARKER = r"[A-Za-z0-9_ .'\"<>=!~(),-]+"
# name, extras, version specifiers (bare or in parentheses), marker: `torch[cuda]>=2,<3; python_version >= "3.10"`
_REQUIREMENT = re.compile(rf"^{_NAME}\s*(?:{_EXTRAS})?\s*(?:{_SPECS}|\(\s*{_SPECS}\s*\))?\s*(?:;\s*{_MARKER})?$")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9-]{0,30})")
# A name ending like an archive is a path to one for the installer.
_ARCHIVES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz")

# The rules, each as a refusal says it.
OPTION = "installer options are not allowed (packages come from the platform's package index)"
OPTION_ON_LINE = "installer options are not allowed after a requirement (e.g. --hash, --config-settings)"
CONTINUATION = "a line may not continue on the next one (no trailing backslash)"
VARIABLE = "environment variables (${...}) are not allowed"
LOCAL_PATH = "local paths and file: URLs are not allowed (a requirement is a package name from the index)"
URL = "URLs are not allowed (packages come from the platform's package index)"
NOT_A_REQUIREMENT = "not a requirement such as numpy or numpy>=2,<3; python_version >= \"3.10\""
TOO_LONG = f"longer than {MAX_LINE} characters"


@dataclass(frozen=True)
class Refusal:
    """One refused line: where it is and which rule it breaks (never its text)."""

    source: str  # "requirements.txt" or "the manifest's requirements"
    line: int  # 1-based line (file) or entry (list) number
    rule: str

    @property
    def where(self) -> str:
        return f"entry {self.line}" if self.source == LIST_SOURCE else f"{self.source}, line {self.line}"

    def __str__(self) -> str:
        return f"requirements: {self.where}: {self.rule}"

    def audit(self) -> dict:
        """What the audit log records of it."""
        return {"field": "requirements", "source": f"{self.source}, {self.where}" if self.source == LIST_SOURCE
                else self.where, "rule": self.rule}


class RefusedLine(ValueError):
    """A requirement line breaks a rule (a ValueError, so pydantic reports it at the manifest's field, which is
    why its own text leaves out the field's name: `str(e.refusal)` is the whole sentence)."""

    def __init__(self, refusal: Refusal):
        super().__init__(f"{refusal.where}: {refusal.rule}")
        self.refusal = refusal


LIST_SOURCE = "the manifest's requirements"


def rule_broken(line: str) -> str | None:
    """The rule `line` (stripped, not a comment) breaks, or None for a plain requirement."""
    if len(line) > MAX_LINE:
        return TOO_LONG
    if line.startswith("-"):
        option = _OPTION.match(line)
        return f"{OPTION}: {option.group(1) if option else '-'}"
    if line.endswith("\\"):
        return CONTINUATION
    if "$" in line:
        return VARIABLE
    if line.startswith((".", "/", "~", "\\")) or "file:" in line.lower():
        return LOCAL_PATH
    if _URL.search(line) or "@" in line:
        return URL
    if re.search(r"\s-", line):
        return OPTION_ON_LINE
    if "/" in line or "\\" in line or line.lower().endswith(_ARCHIVES):
        return LOCAL_PATH
    if not _REQUIREMENT.match(line):
        return NOT_A_REQUIREMENT
    return None


def _strip_comment(raw: str) -> str:
    # as pip reads a requirements file: `#` at the start, or after whitespace, starts a comment
    return re.sub(r"(^|\s+)#.*$", "", raw).strip()


def file_lines(text: str, source: str) -> tuple[str, ...]:
    """The requirements of a requirements file's text; RefusedLine for the first line that breaks a rule."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        if not line:
            continue
        rule = rule_broken(line)
        if rule is not None:
            raise RefusedLine(Refusal(source, number, rule))
        out.append(line)
    if len(out) > MAX_REQUIREMENTS:
        raise RefusedLine(Refusal(source, len(text.splitlines()), f"at most {MAX_REQUIREMENTS} requirements"))
    return tuple(out)


def list_lines(items: Iterable[str]) -> tuple[str, ...]:
    """The manifest's list, each entry checked; RefusedLine for the first entry that breaks a rule."""
    out = []
    for number, item in enumerate(items, start=1):
        line = item.strip()
        rule = rule_broken(line) if line else NOT_A_REQUIREMENT
        if rule is not None:
            raise RefusedLine(Refusal(LIST_SOURCE, number, rule))
        out.append(line)
    if len(out) > MAX_REQUIREMENTS:
        raise RefusedLine(Refusal(LIST_SOURCE, len(out), f"at most {MAX_REQUIREMENTS} requirements"))
    return tuple(out)
