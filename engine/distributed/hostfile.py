"""Hostfiles in `mlx.launch`'s format, checked before any rank starts.

    {"backend": "ring", "hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]}

(a bare list of hosts is accepted too, as mlx.launch does). Rank i listens on host i's IPs:
the ring backend binds exactly those addresses, so a rank is reachable on the interfaces
the hostfile names and nowhere else; a wildcard address (0.0.0.0, ::) is refused.
`--ranks N` writes N loopback hosts. A host that cannot be reached is named in a second or
two, before anything is launched, instead of after ssh's and the ring's long retries.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from brisk.engine.api.errors import BriskError

LOCAL = "127.0.0.1"  # the one host name mlx.launch starts without ssh
SSH_PORT = 22
REACH_TIMEOUT_S = 3.0
MAX_RANKS = 64
MAX_HOSTFILE_BYTES = 1 << 20
SSH_NAME = re.compile(r"(?:[A-Za-z0-9_.-]+@)?[A-Za-z0-9_][A-Za-z0-9_.:%-]*")


class HostfileError(BriskError):
    """A hostfile that cannot be used, or a host in it that is not there."""


@dataclass(frozen=True)
class Host:
    ssh: str
    ips: tuple[str, ...]

    @property
    def local(self) -> bool:
        return self.ssh == LOCAL


def loopback(ranks: int) -> list[Host]:
    # 1 is refused too: mlx.launch hands a group of one an empty hostfile, and its rank fails
    if not 2 <= ranks <= MAX_RANKS:
        raise HostfileError(
            f"--ranks must be between 2 and {MAX_RANKS} (got {ranks}); leave it out to run in one process"
        )
    return [Host(LOCAL, (LOCAL,)) for _ in range(ranks)]


def read_hostfile(path: str | Path) -> list[Host]:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_HOSTFILE_BYTES:
            raise HostfileError(f"Hostfile {path} is larger than {MAX_HOSTFILE_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HostfileError(f"Cannot read hostfile {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HostfileError(f"Hostfile {path} is not JSON: {exc}") from exc
    return parse_hosts(data, str(path))


def parse_hosts(data: object, where: str) -> list[Host]:
    if isinstance(data, dict):
        backend = data.get("backend", "ring") or "ring"
        if backend != "ring":
            raise HostfileError(f"{where}: backend {backend!r} is not supported; Brisk runs ranks on 'ring'")
        data = data.get("hosts")
    if not isinstance(data, list) or not 2 <= len(data) <= MAX_RANKS:
        raise HostfileError(f"{where}: 'hosts' must be a list of 2 to {MAX_RANKS} hosts")
    hosts = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("ssh"), str) or not entry["ssh"].strip():
            raise HostfileError(f"{where}: host {i} needs an 'ssh' name (a string)")
        if not SSH_NAME.fullmatch(entry["ssh"].strip()):
            # mlx.launch hands the name to ssh: '-oProxyCommand=...' would be an option, not a host
            raise HostfileError(f"{where}: host {i}'s ssh name {entry['ssh']!r} is not a host name ([user@]host)")
        ips = entry.get("ips")
        if not isinstance(ips, list) or not ips or not all(isinstance(ip, str) for ip in ips):
            raise HostfileError(f"{where}: host {i} ({entry['ssh']}) needs 'ips', the addresses its rank listens on")
        for ip in ips:
            _check_ip(ip, f"{where}: host {i} ({entry['ssh']})")
        hosts.append(Host(entry["ssh"].strip(), tuple(ips)))
    return hosts


def _check_ip(ip: str, who: str) -> None:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise HostfileError(f"{who}: {ip!r} is not an IP address (the ring backend needs addresses)") from exc
    if address.is_unspecified:
        raise HostfileError(f"{who}: {ip} listens on every interface; name the interface's own address")


def check_reachable(hosts: list[Host], *, timeout: float = REACH_TIMEOUT_S) -> None:
    """Fail fast, naming the host, when a remote host's ssh port does not answer or its
    name does not resolve (loopback hosts need no check)."""
    for i, host in enumerate(hosts):
        if host.local:
            continue
        try:
            with socket.create_connection((host.ssh, SSH_PORT), timeout=timeout):
                pass
        except socket.gaierror as exc:
            raise HostfileError(f"Host {i} ({host.ssh}) is not known here: {exc.strerror}") from exc
        except OSError as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            raise HostfileError(f"Host {i} ({host.ssh}) is not reachable (ssh port {SSH_PORT}: {why})") from exc


def to_launch_json(hosts: list[Host]) -> str:
    return json.dumps({"backend": "ring", "hosts": [{"ssh": h.ssh, "ips": list(h.ips)} for h in hosts]})
