"""An adapter imported without its extra installed says which extra to install."""

import os
import subprocess
import sys
import textwrap

import pytest

import incr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(incr.__file__)))


@pytest.mark.parametrize("adapter,module", [("prefect", "prefect"),
                                            ("langgraph", "langgraph")])
def test_adapter_without_its_extra_names_the_extra(adapter, module):
    # the orchestrator is made unimportable (sys.modules[name] = None) in a fresh process;
    # incr.adapters is loaded from this checkout, as tests/conftest.py does
    prog = textwrap.dedent(f"""
        import importlib.util, os, sys
        sys.modules[{module!r}] = None
        import incr
        here = os.path.join({ROOT!r}, "adapters")
        spec = importlib.util.spec_from_file_location(
            "incr.adapters", os.path.join(here, "__init__.py"),
            submodule_search_locations=[here])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["incr.adapters"] = mod
        spec.loader.exec_module(mod)
        try:
            import incr.adapters.{adapter}
        except ModuleNotFoundError as e:
            print("BARE", e)
        except ImportError as e:
            print("OK", e)
        else:
            print("IMPORTED")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK"), out.stdout
    assert f"pip install 'incr[{adapter}]'" in out.stdout
