"""``python -m ipcshare`` is the ``ipcshare`` command."""

from .cli.main import main

raise SystemExit(main())
