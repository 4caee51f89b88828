"""Loopback ports for the tests' own servers.

A port is picked below the kernel's ephemeral range and checked free. A port the kernel hands out itself
(bind to port 0) is picked from that range, and it is free again as soon as the picker closes it: a
process that binds port 0 in the meantime (the gateway's reply socket does) could be given it, and the
server it was meant for then fails with "Address in use". Below the range no such race exists."""
import random
import socket

_given = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A loopback port that is free now, outside the kernel's ephemeral range, never the same twice here."""
    low = _ephemeral_low()
    if low > 8192:
        for _ in range(500):
            p = random.randrange(max(1024, low - 12000), low)
            if p in _given:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    continue
            _given.add(p)
            return p
    with socket.socket() as s:  # a range that leaves no room below it: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
