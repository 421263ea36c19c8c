"""``python -m services.dispatch``: the dispatch service."""

from services.dispatch.service import main

if __name__ == "__main__":
    main()
