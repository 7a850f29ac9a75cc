"""``PackSettings`` lives in a light module: naming it (a job config does, and so the CLI's help) loads no
pyarrow or packed writer; the package still exports every name it did."""

from __future__ import annotations

import subprocess
import sys


def test_pack_settings_import_loads_no_pyarrow() -> None:
    code = (
        "import sys; from longpack.packed.settings import PackSettings; "
        "from longpack.jobs import PackConfig; import longpack.cli.app; "
        "print(sorted(m for m in ('pyarrow', 'longpack.packed.pipeline') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_package_exports_what_it_did() -> None:
    import longpack.packed as packed
    from longpack.packed import pipeline, settings

    for name in packed.__all__:
        assert getattr(packed, name) is not None
    assert packed.PackSettings is pipeline.PackSettings is settings.PackSettings
