import pathlib
import sys

# the PyTorch oracles live in tests/oracles
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
