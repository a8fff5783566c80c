"""ports.py: a loopback port for a process a test starts to listen on.

A port from bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range (32768-60999 by
default), the range every outgoing connection takes its local port from: between the test
closing its probe socket and the process binding the port, a connection of any test running
beside it can take it, and the process fails to start (a worker never joined, a coordinator
exited). free_port() picks at random below that range and checks that the port binds now;
two tests pick the same one only by a 1-in-12000 chance."""
import random
import socket

LOW, HIGH = 20000, 32768  # below /proc/sys/net/ipv4/ip_local_port_range's default start


def free_port():
    """A port on 127.0.0.1 that nothing listens on now, outside the ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(HIGH, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        high = HIGH
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(LOW, max(LOW + 1, high))
        with socket.socket() as so:
            try:
                so.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in %d-%d" % (LOW, high))
