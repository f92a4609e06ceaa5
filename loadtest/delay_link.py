"""A network link's round trip and bandwidth, made in user space: a TCP relay that holds each
direction's bytes for half the round trip and paces them to the link's bandwidth.

    python -m loadtest.delay_link --listen 10.231.57.12:6380 --to 127.0.0.1:6379 --rtt-ms 10 --mbit 1000

Runs on the serving host (loadtest/hosts.py starts it there): peers connect to `--listen`, and each
connection is relayed to `--to`. Bytes read in either direction wait until half the round trip after
they arrived, then leave no faster than the bandwidth allows, all connections of a direction
sharing it as they share a wire. Prints `listening HOST:PORT` once it accepts connections; a line
`rtt MS` on its standard input changes the round trip from then on (a benchmark measures one set of
fleets at several round trips without restarting them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import socket
import sys
import threading
import time

READ_BYTES = 64 * 1024


class Direction:
    """One direction of the link: its delay and its bandwidth, shared by every connection."""

    def __init__(self, delay_s: float, bytes_per_s: float):
        self.delay_s = delay_s
        self.bytes_per_s = bytes_per_s
        self.free_at = 0.0  # when the wire has sent everything handed to it so far

    def departure(self, arrived: float, size: int) -> float:
        """When bytes that arrived at `arrived` have left: after the delay, once the wire is free,
        and after their own time on the wire."""
        start = max(arrived + self.delay_s, self.free_at)
        self.free_at = start + size / self.bytes_per_s
        return self.free_at


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Direction) -> None:
    """Bytes from `reader` to `writer`, each read held until its departure time; EOF passes on
    once everything before it has left."""
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()
    done = False

    async def read() -> None:
        nonlocal done
        try:
            while data := await reader.read(READ_BYTES):
                held.append((direction.departure(time.monotonic(), len(data)), data))
                more.set()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()

    reading = asyncio.create_task(read())
    try:
        while True:
            while not held:
                if done:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.write_eof()
                    return
                more.clear()
                await more.wait()
            due, data = held.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        reading.cancel()


async def serve(listen: tuple[str, int], to: tuple[str, int], rtt_ms: float, mbit: float) -> None:
    bytes_per_s = mbit * 1e6 / 8
    up, down = Direction(rtt_ms / 2000, bytes_per_s), Direction(rtt_ms / 2000, bytes_per_s)

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*to)
        except OSError:
            client_writer.close()
            return
        for w in (client_writer, server_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:  # a relay must not add Nagle's waits to the link's own
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(pump(client_reader, server_writer, up), pump(server_reader, client_writer, down))
        finally:
            for w in (client_writer, server_writer):
                w.close()

    def follow_stdin() -> None:
        for line in sys.stdin:
            word, _, value = line.partition(" ")
            if word == "rtt":
                up.delay_s = down.delay_s = float(value) / 2000

    threading.Thread(target=follow_stdin, daemon=True, name="rtt-control").start()
    server = await asyncio.start_server(relay, *listen, backlog=1024)
    print(f"listening {listen[0]}:{listen[1]}", flush=True)
    async with server:
        await server.serve_forever()


def _hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.delay_link", description=__doc__.splitlines()[0])
    p.add_argument("--listen", type=_hostport, required=True, help="HOST:PORT the peers connect to")
    p.add_argument("--to", type=_hostport, required=True, help="HOST:PORT of the service relayed to")
    p.add_argument("--rtt-ms", type=float, required=True, help="the link's round trip, ms")
    p.add_argument("--mbit", type=float, default=1000.0, help="the link's bandwidth each way, Mbit/s")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.to, args.rtt_ms, args.mbit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
