"""The command-line programs: `kokoro-fleet` (main.py) and its subcommands, one module each."""
