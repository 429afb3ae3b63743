"""``python -m turnout.oracle.cli`` runs the ``turnout`` command."""

from turnout.oracle.cli import main

main()
