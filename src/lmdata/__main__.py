"""`python -m lmdata` is the `lmdata` command."""

from lmdata.cli import main

if __name__ == "__main__":
    main()
