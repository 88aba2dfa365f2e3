# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of values that reach a unit file, an environment file, a command's argument list or a path on a target
(pure Python, no Ansible imports).

A value with a line break or another control character would end a line of a systemd unit or environment file and
start a new directive of the caller's choosing; a value that starts with "-" would be read as an option by the
command it is given to. Each check returns a message (empty when the value is fine) that names the setting, what is
wrong and what to do, so that each caller raises its own error type before anything is changed.
"""
from __future__ import annotations

import re
from typing import Any, Optional

# A systemd unit name as systemctl takes it (systemd.unit(5): ASCII letters, digits, ":", "-", "_", ".", "\", and one
# "@" for a template instance), not starting with "-" (systemctl would take it for an option).
UNIT_NAME_RE = re.compile(r"[A-Za-z0-9:_.\\@][A-Za-z0-9:_.\\@-]{0,254}")
# A user or group name useradd(8) and systemd's User= accept without a warning: letters, digits, "_", "-", ".",
# not starting with "-" or a digit-only name.
USER_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# An environment variable name that systemd's EnvironmentFile= and a shell both take.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shown(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def control_char(text: str) -> Optional[str]:
    """The first control character of ``text`` as repr shows it ('\\n', '\\x1b'), None when there is none.

    C0 (U+0000-U+001F, tab included), DEL and C1 (U+0080-U+009F), and the Unicode line and paragraph separators."""
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F or char in "\u2028\u2029":
            return repr(char)[1:-1]
    return None


def control_message(name: str, value: Any, where: str = "a unit or environment file") -> str:
    """'' when ``value`` (a string) has no control character; otherwise a message naming the setting."""
    if not isinstance(value, str):
        return ""
    found = control_char(value)
    if found is None:
        return ""
    return ("%s=%s contains the control character %s: a line break or another control character in a value that "
            "reaches %s would start a new line there (a directive of its own); remove it"
            % (name, _shown(value), found, where))


def option_message(name: str, value: Any, command: str = "the command it is given to") -> str:
    """'' unless ``value`` starts with "-", which ``command`` would read as an option."""
    if isinstance(value, str) and value.startswith("-"):
        return ("%s=%s starts with '-', which %s would read as an option rather than as the value; "
                "give the name without a leading '-'" % (name, _shown(value), command))
    return ""


def unit_name_message(name: str, value: Any) -> str:
    """'' when ``value`` is a systemd unit name systemctl takes as a positional argument."""
    if isinstance(value, str) and UNIT_NAME_RE.fullmatch(value):
        return ""
    return ("%s must be a systemd unit name (letters, digits and :_.@-\\, such as sglang.service; not starting with "
            "'-', which systemctl would read as an option), got %s" % (name, _shown(value)))


def user_name_message(name: str, value: Any) -> str:
    """'' when ``value`` is a user or group name (useradd, systemd's User= and Group=)."""
    if isinstance(value, str) and USER_NAME_RE.fullmatch(value):
        return ""
    return ("%s must be a user name (a letter or '_', then letters, digits, '_', '.' or '-'; at most 32 characters), "
            "got %s" % (name, _shown(value)))


def env_name_message(name: str, key: Any) -> str:
    """'' when ``key`` is an environment variable name."""
    if isinstance(key, str) and ENV_NAME_RE.fullmatch(key):
        return ""
    return ("%s has the key %s, which is not an environment variable name (a letter or '_', then letters, digits "
            "or '_'); rename it" % (name, _shown(key)))


def failure_result(text: str) -> dict:
    """A failed task's ``msg`` and ``msg_lines`` for a message of several lines (a refusal with its arithmetic, a
    table): ``msg`` is its first line, pointing at the rest, and ``msg_lines`` the rest as a list. ansible-core's default
    callback (callback_result_format=json, what an installed collection runs with) prints a string's line breaks as
    \\n inside one line and a list one element per line, and it prints ``msg`` twice (the error and the result): the
    arithmetic is printed once, line by line. A one-line message is ``msg`` alone."""
    lines = str(text).split("\n")
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    if len(lines) == 1:
        return {"msg": lines[0]}
    return {"msg": lines[0].rstrip() + " (continued in msg_lines, below)", "msg_lines": lines[1:]}
