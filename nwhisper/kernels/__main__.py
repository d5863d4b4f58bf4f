"""`python -m nwhisper.kernels`: rewrite the generated launcher modules from the kernel bodies."""

from nwhisper.kernels import _compile

for target in ("cpu", "cuda"):
    _compile.write(target)
    print(f"wrote {_compile.path(target)}")
