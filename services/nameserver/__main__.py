"""``python -m services.nameserver``: the name server."""

from services.nameserver.service import main

if __name__ == "__main__":
    main()
