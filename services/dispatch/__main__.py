"""``python -m services.dispatch``: the dispatch service."""

from tide.grpc_defaults import use_tide_grpc_defaults

use_tide_grpc_defaults()  # before anything imports grpc (tide/grpc_defaults.py)

from services.dispatch.service import main  # noqa: E402

if __name__ == "__main__":
    main()
