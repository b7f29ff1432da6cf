#!/usr/bin/env python3
"""Free ports for the five-minute tour, as shell assignments.

    eval "$(python3 docs/tour/ports.py)"

sets REDIS_PORT, APP_PORT, ADMIN_PORT, GATEWAY_PORT and DASHBOARD_PORT to
ports on 127.0.0.1 that nothing listens on now, so that the tour uses its
own Redis and servers and none that another program holds (a Redis on 6379,
a service on 8080).
"""
import socket

NAMES = ["REDIS_PORT", "APP_PORT", "ADMIN_PORT", "GATEWAY_PORT", "DASHBOARD_PORT"]

if __name__ == "__main__":
    # All held at once, so that the ports differ; closed before they are used.
    socks = []
    for _ in NAMES:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(f"{n}={s.getsockname()[1]}" for n, s in zip(NAMES, socks)))
    for s in socks:
        s.close()
