"""`python -m nwhisper ...`: the same command as the `nwhisper` console script."""
from nwhisper.cli.main import main

main(prog_name="nwhisper")
