import sys
from pathlib import Path

# The client as checked out (Warden's suite runs these tests too); `pip install ./clients/python` is
# tested by test_package.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
