"""What the server's CPU side costs per audio-second: a simulated fleet with no service time, driven
until the CPU saturates, next to the encoder alone.

    python -m loadtest.frontend [--workers 2] [--concurrency 24] [--seconds 15] [--formats mp3,opus,aac,flac,wav,pcm]
                                [--texts paragraphs] [--sim-chunk-ms A --sim-phoneme-ms B --batch-max K]

Starts `kokoro-fleet serve --engine sim` with a zero cost model (KOKORO_SIM_CHUNK_MS=0,
KOKORO_SIM_PHONEME_MS=0: every chunk is ready at once, so everything the CPU does is the front end:
HTTP, admission, text frontend, Redis, encoding, streaming), and, per `response_format`, keeps
`--concurrency` keep-alive connections sending the same 3-second request (streamed) for `--seconds`.
It reads the CPU time of the whole server (launcher, workers, embedded redis-server) from /proc
before and after, and prints per format:

* server CPU-seconds per audio-second served, and requests per second per core (requests per
  server CPU-second: what one fully used core would serve);
* the encoder alone (api.encoders, the same audio in the same pieces, in this process, one thread),
  CPU-seconds per audio-second, and the full path's ratio to it;
* cores per 1,000 audio-s/s: the cores a box's front end needs per 1,000 audio-seconds a second.

`--texts` sends a sample set in turn instead of the one sentence, and `--sim-chunk-ms`,
`--sim-phoneme-ms`, `--batch-max` give the simulated replicas a service time (a batched pass's cost),
so the front end works at the rates and batch sizes a GPU box would see.

`--lame-check speech.wav` instead compares LAME's quality levels on a recording (e.g. from
`kokoro-fleet say ... -o speech.wav`): CPU per audio-second and the log-spectral distance of each
decoded result to the PCM (the listening-free check behind the mp3 encoder's setting).

The load generator runs in its own process and is not counted; on a machine with few cores it
competes with the server for them, which lowers the throughput but not the cost per audio-second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from api.encoders import FORMATS, make_encoder
from loadtest.dispatch import FleetProcess, process_tree
from loadtest.texts import load_texts
from worker.audio import SAMPLE_RATE

# One chunk of about 3 s of speech, the request the goals are stated for: 3.02 s from the
# simulated engine, whose audio lengths are scaled to the real model's (worker/sim_engine.py). The
# run prints the length it measured beside the table.
TEXT = "The morning train always leaves at nine sharp."
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the server's CPU time ----------------------------------------------------------------------

def cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process tree so far: in all, and of its redis-server."""
    total = {"all": 0.0, "redis": 0.0}
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            redis = b"redis-server" in Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        total["all"] += seconds
        total["redis"] += seconds if redis else 0.0
    return total


# --- the load: keep-alive streamed requests -----------------------------------------------------

async def _read_response(reader: asyncio.StreamReader) -> tuple[int, int, bool]:
    """(status, body bytes, server closes) of one HTTP/1.1 response, chunked or sized."""
    status = int((await reader.readline()).split()[1])
    length, chunked, close = 0, False, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
        elif name == "connection" and value == "close":
            close = True
    if not chunked:
        await reader.readexactly(length)
        return status, length, close
    body = 0
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status, body, close
        body += size


async def _connection(port: int, requests: list[bytes], first: int, stop_at: float, counts: dict) -> None:
    """Sends `requests` in turn from the `first`; counts statuses, and 200s per request (`served`)."""
    reader = writer = None
    turn = first
    while time.perf_counter() < stop_at:
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        which = turn % len(requests)
        turn += 1
        writer.write(requests[which])
        status, size, close = await _read_response(reader)
        counts[status] = counts.get(status, 0) + 1
        if status == 200:
            counts["bytes"] = counts.get("bytes", 0) + size
            counts.setdefault("served", [0] * len(requests))[which] += 1
        if close:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def _drive(port: int, fmt: str, texts: list[str], concurrency: int, seconds: float, out) -> None:
    """In a child process: `concurrency` connections for `seconds`, each sending the texts in turn
    (from a different one); sends back the counts."""
    requests = []
    for text in texts:
        body = json.dumps({"model": "kokoro", "voice": "af_heart", "input": text, "response_format": fmt,
                           "stream": True}).encode()
        requests.append((f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    counts: dict = {}

    async def main() -> None:
        stop_at = time.perf_counter() + seconds
        await asyncio.gather(*(_connection(port, requests, i, stop_at, counts) for i in range(concurrency)))

    asyncio.run(main())
    out.send(counts)


def drive(port: int, fmt: str, concurrency: int, seconds: float, texts: list[str] | None = None) -> dict:
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_drive, args=(port, fmt, texts or [TEXT], concurrency, seconds, send))
    child.start()
    counts = receive.recv()
    child.join()
    return counts


# --- the encoder alone --------------------------------------------------------------------------

def encoder_cost(fmt: str, pieces: list[np.ndarray], min_seconds: float = 2.0) -> float:
    """CPU seconds per audio second of one response's encoder (this thread's CPU time), encoding
    `pieces` as a streamed response, repeated for at least `min_seconds` of CPU."""
    audio_s = sum(len(p) for p in pieces) / SAMPLE_RATE
    start, runs = time.thread_time(), 0
    while time.thread_time() - start < min_seconds:
        encoder = make_encoder(fmt, streamed=True)
        for pcm in pieces:
            encoder.encode(pcm)
        encoder.finish()
        encoder.close()
        runs += 1
    return (time.thread_time() - start) / (runs * audio_s)


def log_spectral_distance(reference: np.ndarray, decoded: np.ndarray, max_hz: float = 7000.0) -> float:
    """Mean over frames (those within 60 dB of the loudest) of the RMS difference in dB between
    the two power spectra, below `max_hz` (the speech band, under the codec's lowpass); `decoded` is
    first aligned to `reference` (the codec's delay) by cross-correlation of the first second."""
    n, hop = 512, 256
    probe = reference[:SAMPLE_RATE]
    delay = max(range(0, 4096), key=lambda d: float(np.dot(probe, decoded[d:d + len(probe)]))
                if d + len(probe) <= len(decoded) else -np.inf)
    decoded = decoded[delay:delay + len(reference)]
    m = min(len(reference), len(decoded))
    window = np.hanning(n)

    def power(x: np.ndarray) -> np.ndarray:
        frames = np.lib.stride_tricks.sliding_window_view(x[:m], n)[::hop] * window
        return np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-10

    a, b = power(reference), power(decoded)
    loud = 10 * np.log10(a.sum(axis=1))
    keep = loud > loud.max() - 60
    band = slice(1, int(max_hz / (SAMPLE_RATE / n)))
    diff = 10 * np.log10(a[keep][:, band]) - 10 * np.log10(b[keep][:, band])
    return float(np.mean(np.sqrt(np.mean(diff ** 2, axis=1))))


def lame_check(path: str, levels=(None, 2, 5, 7, 9)) -> None:
    """LAME's quality levels (FFmpeg's compression_level; None: FFmpeg's default) on a recording."""
    import io
    import wave

    import av

    from api import encoders

    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    default = encoders._CODECS["mp3"]
    try:
        for level in levels:
            options = {} if level is None else {"compression_level": str(level)}
            encoders._CODECS["mp3"] = encoders._Codec("mp3", "libmp3lame", options, {}, default.bit_rate)
            cost = encoder_cost("mp3", [pcm])
            encoder = make_encoder("mp3", streamed=True)
            data = encoder.encode(pcm) + encoder.finish()
            with av.open(io.BytesIO(data)) as container:
                decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
            lsd = log_spectral_distance(pcm, decoded.astype(np.float32))
            print(f"compression_level {'default' if level is None else level}: {cost * 1000:.2f} CPU-ms per "
                  f"audio-s, log-spectral distance to the PCM {lsd:.2f} dB")
    finally:
        encoders._CODECS["mp3"] = default


def request_audio(port: int, text: str = TEXT) -> np.ndarray:
    """The request's audio as the server streams it (pcm), as float32."""
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=60,
                   json={"model": "kokoro", "voice": "af_heart", "input": text, "response_format": "pcm"})
    r.raise_for_status()
    return np.frombuffer(r.content, dtype="<i2").astype(np.float32) / 32767.0


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.frontend", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=24, help="keep-alive connections of the load")
    parser.add_argument("--seconds", type=float, default=15.0, help="load per format")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--texts", default="",
                        help="a loadtest text set (short, paragraphs, long or a file) sent in turn; default: one "
                             "3-second sentence")
    parser.add_argument("--sim-chunk-ms", type=float, default=0.0,
                        help="the simulated engine's cost of one pass (KOKORO_SIM_CHUNK_MS; default 0: no service time)")
    parser.add_argument("--sim-phoneme-ms", type=float, default=0.0,
                        help="... and of each phoneme of every padded row (KOKORO_SIM_PHONEME_MS; default 0)")
    parser.add_argument("--batch-max", type=int, default=1, help="KOKORO_BATCH_MAX of the fleet (default 1)")
    parser.add_argument("--lame-check", metavar="WAV", help="compare LAME's quality levels on this recording")
    args = parser.parse_args(argv)
    if args.lame_check:
        print(cpu_model())
        lame_check(args.lame_check)
        return
    formats = [f for f in args.formats.split(",") if f]

    env = {"KOKORO_SIM_CHUNK_MS": str(args.sim_chunk_ms), "KOKORO_SIM_PHONEME_MS": str(args.sim_phoneme_ms),
           "KOKORO_BATCH_MAX": str(args.batch_max), "KOKORO_PLAYGROUND": "false",
           "KOKORO_MAX_REQUESTS": "1024", "KOKORO_QUEUE_MAX_REQUESTS": "4096",
           "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "100000"}
    texts = load_texts(args.texts) if args.texts else [TEXT]
    fleet = FleetProcess(args.workers, engine="sim", env=env, log_dir=args.log_dir, name="frontend-bench")
    fleet.start(ready_timeout=300)
    rows = []
    try:
        # Each text's audio (the simulated engine's lengths are deterministic); the encoder alone
        # is timed on the first, one piece (the server encodes piece by piece, one per chunk).
        audios = [request_audio(fleet.port, text) for text in texts]
        text_seconds = [len(a) / SAMPLE_RATE for a in audios]
        audio = audios[0]
        pieces = [audio]
        for fmt in formats:
            drive(fleet.port, fmt, min(4, args.concurrency), 1.0, texts)  # warm: connections, codecs, caches
            before = cpu_seconds(fleet.proc.pid)
            started = time.perf_counter()
            counts = drive(fleet.port, fmt, args.concurrency, args.seconds, texts)
            wall = time.perf_counter() - started
            after = cpu_seconds(fleet.proc.pid)
            cpu, redis_cpu = after["all"] - before["all"], after["redis"] - before["redis"]
            served = counts.get(200, 0)
            served_audio = sum(n * s for n, s in zip(counts.get("served", []), text_seconds))
            alone = encoder_cost(fmt, pieces)
            full = cpu / served_audio if served_audio else float("nan")
            rows.append({"format": fmt, "requests": served, "refused": counts.get(503, 0),
                         "other": sum(v for k, v in counts.items() if isinstance(k, int) and k not in (200, 503)),
                         "wall_s": wall, "server_cpu_s": cpu, "redis_share": redis_cpu / cpu if cpu else 0.0, "audio_s": served_audio, "full": full,
                         "alone": alone, "rps_per_core": served / cpu if cpu else float("nan"),
                         "audio_per_core": served_audio / cpu if cpu else float("nan")})
            r = rows[-1]
            print(f"{fmt}: {served} requests, {served_audio:.0f} audio-s ({r['refused']} refused, {r['other']} other) "
                  f"in {wall:.1f} s, "
                  f"server CPU {cpu:.1f} s, {100 * r['redis_share']:.0f}% of it redis-server "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        fleet.stop()

    service = (f"service time {args.sim_chunk_ms:g} ms + {args.sim_phoneme_ms:g} ms x phonemes x rows a pass, "
               f"batch max {args.batch_max}" if args.sim_chunk_ms or args.sim_phoneme_ms else "service time 0")
    requests = (f"{len(audio) / SAMPLE_RATE:.2f} s requests ({TEXT!r}, one chunk)" if not args.texts else
                f"the {len(texts)} texts of {args.texts!r} in turn ({sum(text_seconds) / len(texts):.1f} s of audio "
                f"each on average)")
    print(f"\n{cpu_model()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}; sim fleet of {args.workers} "
          f"workers, {service}; {requests}, {args.concurrency} keep-alive streams; "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print("| format | full path CPU-s per audio-s | cores per 1,000 audio-s/s | encoder alone | full / encoder | "
          "requests/s per core | audio-s/s per core | redis-server's share |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['full'] * 1000:.2f} ms | {cores_per_thousand(r['full']):.1f} | "
              f"{r['alone'] * 1000:.2f} ms | {r['full'] / r['alone']:.2f}x | {r['rps_per_core']:.0f} | "
              f"{r['audio_per_core']:.0f} | {100 * r['redis_share']:.0f}% |")


def cores_per_thousand(cpu_s_per_audio_s: float) -> float:
    """Cores busy serving 1,000 audio-seconds a second at this CPU cost per audio-second."""
    return 1000 * cpu_s_per_audio_s


if __name__ == "__main__":
    main()
