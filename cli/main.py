"""`kokoro-fleet`: one command line for the whole product.

Each subcommand lives in the module that owns its step, which exposes the two functions the
table names (`configure(parser)` and `run(args) -> int` unless it holds several commands); this
file only lists them, so `kokoro-fleet --help` stays fast (nothing heavy is imported until a
subcommand runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from api.settings import SettingsError


@dataclass(frozen=True)
class Command:
    module: str
    help: str
    configure: str = "configure"  # the module's functions, by name: imported only when the command runs
    run: str = "run"


COMMANDS: dict[str, Command] = {
    "serve": Command("cli.serve_cli", "run the HTTP server (OpenAI audio API)"),
    "status": Command("cli.status_cli", "show the fleet's replicas: busy, jobs done, audio seconds"),
    "say": Command("cli.say_cli", "synthesize text to an audio file (wav, mp3, opus, ...), no server needed"),
    "weights": Command("cli.weights_cli", "show or prepare the model weights in use"),
    "gpu-check": Command("cli.gpu_check_cli", "show the GPU, whether MPS starts, and the replicas serve would run"),
    "normalize": Command("cli.text_cli", "print the normalized text", "configure_normalize", "run_normalize"),
    "phonemize": Command("cli.text_cli", "print the chunks and their phonemes", "configure_phonemize", "run_phonemize"),
    "voice": Command("cli.voice_fit_cli", "fit a voice of your own to a recording (voice fit sample.wav --name af_mine)"),
    "settings": Command("cli.settings_cli", "print every setting as docs/configuration.md's table"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="kokoro-fleet", description="Kokoro-82M text-to-speech server and tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if name == wanted:  # import only the module of the command being run
            mod = importlib.import_module(command.module)
            getattr(mod, command.configure)(p)
            p.set_defaults(_run=getattr(mod, command.run))
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args._run(args) or 0)
    except SettingsError as error:  # a mistyped setting: one line that names it, no traceback
        print(f"kokoro-fleet {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
