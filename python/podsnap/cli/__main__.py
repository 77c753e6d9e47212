from podsnap.cli import main

raise SystemExit(main())
