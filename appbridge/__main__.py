from appbridge.cli import main

raise SystemExit(main())
