"""`python -m lmdata` is the `lmdata` command."""

from lmdata._console import main

if __name__ == "__main__":
    main()
