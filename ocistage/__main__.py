"""``python -m ocistage``: the same command line as the ``ocistage`` script."""

from ocistage.bundler.cli.app import main

if __name__ == "__main__":
    main()
