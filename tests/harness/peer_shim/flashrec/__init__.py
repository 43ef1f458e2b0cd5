"""A stand-in for a peer engine installed with ``pip install --target``: a package also named
``flashrec`` (like the public flashrec 0.1.2), with that engine's command line, and nothing of
this checkout's package (no ``flashrec.parentwatch``). ``__main__`` serves through this
checkout's FlashRec, so the tests get a real second server behind the peer's name clash."""
