"""`python -m evaluator.cli`: the `proxaudit` command."""

from evaluator.cli.main import main

main()
