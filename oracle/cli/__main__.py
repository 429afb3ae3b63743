"""``python -m oracle.cli`` runs the ``turnout`` command."""

from oracle.cli import main

main()
