# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's releases and the HiCache rules of each (pure Python, no Ansible imports).

An SGLang version as given (``0.5.9``, ``0.5.5rc1``, ``0.5.15.dev0``, ``0.5.9.post1``, ``0.5.9+cu128``)
is parsed and mapped to the final releases whose code it may carry; :class:`Rules` says how one
release allocates and checks its host pools.  The table of rules with the file each was read from is
in docs/sizing.md ("Rules by release").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.inferops.gpu_inference.plugins.module_utils.sizing.sizing_values import GIB_BYTES, PlanError

Release = Tuple[int, int, int]

#: SGLang's own reserve (``HICACHE_HOST_MEMORY_RESERVE_BYTES``), 10 GiB in every version.
SGLANG_RESERVE_BYTES = 10 * GIB_BYTES

#: SGLang's final releases from the first whose HiCache behaviour this model knows (0.5.0 was
#: published as release candidates only).
KNOWN_RELEASES: Tuple[Release, ...] = ((0, 4, 9), (0, 4, 10)) + tuple((0, 5, n) for n in range(1, 24))
KNOWN_FIRST_VERSION = KNOWN_RELEASES[0]
KNOWN_LAST_VERSION = KNOWN_RELEASES[-1]

_VERSION_RE = re.compile(
    r"^v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})"
    r"(?:[.\-_]?(rc|c|a|alpha|b|beta|pre|preview)[.\-_]?(\d{1,6})?)?"
    r"(?:[.\-_]?(post|rev|r)[.\-_]?(\d{1,6})?)?"
    r"(?:[.\-_]?(dev)[.\-_]?(\d{1,6})?)?"
    r"(?:\+([a-z0-9]+(?:[.\-_][a-z0-9]+)*))?$",
    re.IGNORECASE,
)


def release_text(key: Release) -> str:
    return "%d.%d.%d" % key


@dataclass(frozen=True)
class Rules:
    """The HiCache host-memory behaviour of one SGLang release (docs/sizing.md, table of rules)."""

    release: Release
    post: int = 0  # the post number of a post release of ``release`` whose code was read (EXACT_PIN_FROM_POST)

    def __str__(self) -> str:
        return release_text(self.release) + (".post%d" % self.post if self.post else "")

    @property
    def pins_power_of_two(self) -> bool:
        """Up to 0.5.4 torch's pinned allocator rounds each pool up to the next power of two;
        0.5.4.post2 and later post releases of 0.5.4 already register exactly (cudaHostRegister)."""
        return self.release <= (0, 5, 4) and self.post < EXACT_PIN_FROM_POST.get(self.release, 1 << 30)

    @property
    def has_attn_dp_size(self) -> bool:
        """From 0.5.22 attention DP is ``--attn-dp-size N``; ``--enable-dp-attention`` maps to it."""
        return self.release >= (0, 5, 22)

    @property
    def pages_align_up(self) -> bool:
        """From 0.5.6 the token count is aligned up to whole pages plus one page; before, down."""
        return self.release >= (0, 5, 6)

    @property
    def has_server_info(self) -> bool:
        """From 0.5.6 the server's own arguments are served at ``/server_info`` too (``/get_server_info`` deprecated
        but kept); 0.5.5 and before have only ``/get_server_info`` (entrypoints/http_server.py)."""
        return self.release >= (0, 5, 6)

    @property
    def asserts_host_exceeds_device(self) -> bool:
        """Up to 0.5.14 start-up asserts that the host pool holds more tokens than the device pool."""
        return self.release <= (0, 5, 14)

    @property
    def pp_min_tokens(self) -> bool:
        """From 0.5.15 a fixed size takes the minimum token count across PP stages; before, each
        stage rounds its own."""
        return self.release >= (0, 5, 15)

    @property
    def dsa_indexer(self) -> str:
        """'none' up to 0.5.8 (no DSA host pool), 'inside' 0.5.9-0.5.18 (indexer bytes counted in
        --hicache-size, one buffer per layer), 'outside' from 0.5.19 (a separate pool of the KV
        pool's token count)."""
        if self.release <= (0, 5, 8):
            return "none"
        return "inside" if self.release <= (0, 5, 18) else "outside"

    @property
    def guard_divisor(self) -> str:
        """What SGLang's own check divides the free memory by."""
        if self.release <= (0, 5, 18):
            return "none"
        return "world_size // nnodes" if self.release <= (0, 5, 20) else "tp x pp // nnodes"

    @property
    def guard_reads_cgroup(self) -> bool:
        return self.release >= (0, 5, 21)

    @property
    def allocation(self) -> str:
        if self.pins_power_of_two:
            return "torch pin_memory (rounded up to a power of two)"
        if self.release <= (0, 5, 12):
            return "torch.empty + cudaHostRegister (exact size, locked at start-up)"
        return "mmap MAP_SHARED|MAP_POPULATE + cudaHostRegister (exact size, counted as Shmem)"


@dataclass(frozen=True)
class SglangVersion:
    """An SGLang version as given, with the releases whose behaviour it may have."""

    text: str
    major: int
    minor: int
    patch: int
    pre: bool = False
    post: bool = False
    post_number: int = 0
    dev: bool = False
    local: bool = False

    def __str__(self) -> str:
        return self.text

    @property
    def key(self) -> Release:
        return (self.major, self.minor, self.patch)

    @property
    def is_final(self) -> bool:
        return not (self.pre or self.post or self.dev or self.local)


def parse_version(value: Any) -> SglangVersion:
    """Parse an SGLang version such as ``0.5.9``, ``v0.5.9``, ``0.5.10.post1``, ``0.5.5rc1``,
    ``0.5.15.dev0`` or ``0.5.9+cu128``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PlanError(
            "sglang_version must be a release number such as '0.5.9' (the version of the installed sglang package), got %s"
            % type(value).__name__
        )
    text = str(value).strip()
    match = _VERSION_RE.match(text) if len(text) <= 64 else None
    if not match:
        raise PlanError(
            "sglang_version %r is not an SGLang release number: give it as MAJOR.MINOR.PATCH, "
            "for example '0.5.9' (the version of the installed sglang package)" % (text[:64],)
        )
    version = SglangVersion(
        text=text.lower().lstrip("v"),
        major=int(match.group(1)),
        minor=int(match.group(2)),
        patch=int(match.group(3)),
        pre=match.group(4) is not None,
        post=match.group(6) is not None,
        post_number=int(match.group(7) or 0) if match.group(6) is not None else 0,
        dev=match.group(8) is not None,
        local=match.group(10) is not None,
    )
    behaviour_releases(version)  # refuses what lies before the first known release
    return version


def _prev_release(key: Release) -> Optional[Release]:
    older = [r for r in KNOWN_RELEASES if r < key]
    return older[-1] if older else None


def _next_release(key: Release) -> Optional[Release]:
    newer = [r for r in KNOWN_RELEASES if r > key]
    return newer[0] if newer else None


def behaviour_releases(version: SglangVersion) -> Tuple[List[Release], Optional[str]]:
    """The releases whose behaviour ``version`` may have, and the warning that says so.

    A final release behaves as itself.  A pre-release or dev build of X lies between the release
    before X and X; a post release of X between X and the next release (SGLang cuts post releases
    from main); a local build (``+tag``) may be either neighbour.  The plan must hold for every
    release in the list, so each rule is taken at its most expensive.
    """
    key = version.key
    if key < KNOWN_FIRST_VERSION or (key == KNOWN_FIRST_VERSION and (version.pre or (version.dev and not version.post) or version.local)):
        raise PlanError(
            "sglang_version %s is older than 0.4.9, the first release whose HiCache memory behaviour "
            "this model knows; upgrade SGLang or size the cache by hand" % version
        )
    if key > KNOWN_LAST_VERSION:
        return [KNOWN_LAST_VERSION], (
            "SGLang %s is newer than 0.5.23, the last release this model was checked against; it is treated as 0.5.23" % version
        )
    known = key in KNOWN_RELEASES
    below = key if known else _prev_release(key)
    above = key if known else _next_release(key)
    releases: List[Release] = []
    if version.post:
        releases = [below or key]
        if _next_release(below or key):
            releases.append(_next_release(below or key))  # type: ignore[arg-type]
        why = "a post release, cut after %s" % release_text(below or key)
    elif version.pre or version.dev:
        releases = [_prev_release(key) or key, above or KNOWN_LAST_VERSION]
        why = "a pre-release or dev build of %s" % release_text(key)
    elif known:
        releases = [key]
        why = ""
    else:
        releases = [below or key, above or KNOWN_LAST_VERSION]
        why = "not a published final release (%s lies between two releases)" % release_text(key)
    if version.local:
        lo, hi = min(releases), max(releases)
        releases += [r for r in (_prev_release(lo), _next_release(hi)) if r is not None]
        why = (why + ", and a local build" if why else "a local build of %s" % release_text(key))
    releases = sorted(set(releases))
    if len(releases) == 1:
        if not version.is_final:
            # A post, local or pre-release build with one candidate (a post release of the last known release):
            # still said, as a newer version's is.
            last = " (the last release this model was checked against)" if releases[0] == KNOWN_LAST_VERSION else ""
            return releases, "SGLang %s is %s%s: it is treated as %s" % (version, why, last, release_text(releases[0]))
        return releases, None
    return releases, (
        "SGLang %s is %s: its code may behave as %s; the plan holds for each of them (every rule at its most expensive)"
        % (version, why, " or ".join(release_text(r) for r in releases))
    )


def release_rules(version: Any) -> List[Rules]:
    """The rules of every release ``version`` (text, SglangVersion) may behave as."""
    parsed = version if isinstance(version, SglangVersion) else parse_version(version)
    return rules_for(parsed, behaviour_releases(parsed)[0])


#: Releases whose post releases were read and changed the allocation: from this post number the pools
#: are registered exactly (0.5.4.post2 and .post3: mem_cache/memory_pool_host.py init_kv_buffer,
#: cudaHostRegister, the same file as 0.5.5's; 0.5.4.post1 pins as 0.5.4).
EXACT_PIN_FROM_POST: Dict[Release, int] = {(0, 5, 4): 2}


def rules_for(version: SglangVersion, releases: Sequence[Release]) -> List[Rules]:
    """The Rules of each release a version may carry.  A post release of X whose post releases were read
    (``EXACT_PIN_FROM_POST``) carries X's rules with its post number, which the Rules properties key on;
    any other post release carries X's rules, or the next release's."""
    if version.post and version.key in EXACT_PIN_FROM_POST:
        return [Rules(r, post=version.post_number) if r == version.key else Rules(r) for r in releases]
    return [Rules(r) for r in releases]


def server_info_path(version: Any) -> str:
    """The HTTP path of the running server's own arguments: ``server_info`` when every release ``version`` may carry
    serves it, else ``get_server_info``, which every release this model knows serves."""
    return "server_info" if all(rules.has_server_info for rules in release_rules(version)) else "get_server_info"


def rules_of(version: Any) -> Rules:
    """The rules of one release: given as Rules, or the first release a version (text, SglangVersion) may behave as."""
    return version if isinstance(version, Rules) else release_rules(version)[0]


def distinct_guards(releases: Sequence[Rules]) -> List[Rules]:
    """One release per distinct behaviour of SGLang's own start-up check."""
    seen: Dict[Tuple[str, bool, bool, bool, bool], Rules] = {}
    for rules in releases:
        key = (rules.guard_divisor, rules.guard_reads_cgroup, rules.release <= (0, 5, 21), rules.pins_power_of_two, rules.dsa_indexer == "outside")
        seen.setdefault(key, rules)
    return list(seen.values())
