"""Imported by Python at start where ``tests/plants`` is on ``PYTHONPATH`` (``tests/conftest.py``
puts it there for every process the tests start; ``scripts/gate_calibration.py`` for its
servers). Installs the plants of ``flashrec_plants`` whose variables are set; otherwise it
costs three environment lookups."""

import os

if any(os.environ.get(k) for k in ("FLASHREC_TEST_STEP_DELAY_MS", "FLASHREC_TEST_STEP_GATE", "FLASHREC_TEST_PLANT_ID_CACHE", "FLASHREC_CALIB_SPIN_US", "FLASHREC_TEST_RELOAD_GATE")):  # fmt: skip
    import flashrec_plants

    flashrec_plants.install_from_env()
