"""python -m nwhisper.server [MODEL] --addr HOST:PORT … — the same as `nwhisper serve`."""

from ..cli.serve import command

command(prog_name="python -m nwhisper.server")
