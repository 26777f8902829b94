"""The agent protocol's own cost (issue 14): HTTP/2 over one unix socket, nothing else.

Run from the repository root::

    .venv/bin/python bench/agent_protocol.py [--calls 1000]

Starts the real ``deskbox-agent`` (desktop_image/agent) on a unix socket in a temporary
directory, with two extra calls (``blob``: N bytes back, like a JPEG screenshot), connects
the real host client (server/deskbox_server/agent) and measures round trips, sequentially:
a trivial call (``echo {}``), a 140 KiB response, ``exec true`` and one byte there and back
over a TCP channel. Prints a markdown table (median and p95 in ms). The issue's end-to-end
targets (websocket screenshot p50 ≤ 5 ms, click ≤ 2 ms) leave the protocol well under 1 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from deskbox_server.agent import AgentClient

ROOT = Path(__file__).resolve().parent.parent
AGENT = """
import sys
from deskbox_agent import __main__ as m
from deskbox_agent.registry import Blob
registry = m.default_registry()
async def blob(args):
    return Blob(b"\\x5a" * int(args.get("size", 0)), "image/jpeg")
registry.register("blob", blob)
m.default_registry = lambda: registry
sys.exit(m.main(sys.argv[1:]))
"""


def p95(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Row:
    def __init__(self, name: str, samples: list[float], host_cpu: float, agent_cpu: float):
        self.name, self.samples = name, samples
        self.host_us = host_cpu / len(samples) * 1e6
        self.agent_us = agent_cpu / len(samples) * 1e6


async def timed(
    name: str, agent_pid: int, n: int, call: Callable[[], Awaitable[object]]
) -> Row:
    for _ in range(min(50, n)):  # warm up
        await call()
    samples = []
    host, agent = time.process_time(), cpu_s(agent_pid)
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return Row(name, samples, time.process_time() - host, cpu_s(agent_pid) - agent)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def measure(sock: str, calls: int, pid: int) -> list[Row]:
    client = await AgentClient.connect_unix(sock)
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        rows = [
            await timed("call `echo {}`", pid, calls, lambda: client.call("echo", {})),
            await timed("call `blob` 140 KiB", pid, calls,
                        lambda: client.call("blob", {"size": 140 * 1024})),
        ]

        async def exec_true() -> None:
            async for _ in client.exec(["true"]):
                pass

        rows.append(await timed("exec `true`", pid, max(1, calls // 5), exec_true))
        channel = await client.open_tcp(server.sockets[0].getsockname()[1])

        async def ping() -> None:
            await channel.write(b"x")
            assert await channel.read() == b"x"

        rows.append(await timed("tcp channel, 1 byte there and back", pid, calls, ping))
        channel.close()
        await asyncio.sleep(0.2)  # the agent closes its socket, the echo handler returns
        return rows
    finally:
        server.close()
        await client.close()


def framing_us(calls: int, size: int = 120) -> float:
    """HTTP/2's own CPU per call, both ends together, in memory (no socket, no loop): one
    DATA frame of ``size`` bytes each way on an open stream, as the call stream sends a
    click, with the window updates each end hands back. What a framing of our own could
    save at most."""
    import h2.config
    import h2.connection
    import h2.events

    host = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    agent = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    host.initiate_connection()
    agent.initiate_connection()
    agent.receive_data(host.data_to_send())
    host.receive_data(agent.data_to_send())
    host.send_headers(1, [(":method", "POST"), (":path", "/v1/calls"), (":scheme", "http"),
                          (":authority", "agent")])
    agent.receive_data(host.data_to_send())
    agent.send_headers(1, [(":status", "200")])
    host.receive_data(agent.data_to_send())
    message = b"x" * size

    def deliver(sender: h2.connection.H2Connection, to: h2.connection.H2Connection) -> None:
        for event in to.receive_data(sender.data_to_send()):
            if isinstance(event, h2.events.DataReceived):
                to.acknowledge_received_data(event.flow_controlled_length, event.stream_id)

    started = time.process_time()
    for _ in range(calls):
        host.send_data(1, message)
        deliver(host, agent)
        agent.send_data(1, message)
        deliver(agent, host)
        deliver(host, agent)  # the host's window update
    return (time.process_time() - started) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "agent.sock")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "desktop_image" / "agent")}
        agent = subprocess.Popen([sys.executable, "-c", AGENT, "--listen", f"unix:{sock}"],
                                 env=env, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(sock)
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
            rows = asyncio.run(measure(sock, args.calls, agent.pid))
        finally:
            agent.terminate()
            agent.wait()
    print(f"### Agent protocol over a unix socket ({args.calls} sequential calls)\n")
    print("| round trip | p50 ms | p95 ms | host CPU µs/call | agent CPU µs/call | n |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.name} | {statistics.median(row.samples):.3f} | {p95(row.samples):.3f} |"
              f" {row.host_us:.0f} | {row.agent_us:.0f} | {len(row.samples)} |")
    print(f"\nHTTP/2 framing alone, both ends, in memory: "
          f"{framing_us(max(args.calls, 10000)):.0f} µs of CPU per call.")
    print(f"\nLoad average while measuring: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs (wall times include waiting for a CPU).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
