"""``python -m services.storage``: the storage service."""

from services.storage.service import main

if __name__ == "__main__":
    main()
