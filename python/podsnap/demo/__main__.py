from podsnap.demo._worker import main

raise SystemExit(main())
