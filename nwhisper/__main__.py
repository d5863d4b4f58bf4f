"""`python -m nwhisper ...`: the same command as the `nwhisper` console script."""
from nwhisper.cli.main import cli

cli(prog_name="nwhisper")
