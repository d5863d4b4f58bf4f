"""nwhisper's build backend: setuptools', which also asks, for a wheel, for the packages nwhisper
itself needs — setup.py runs nwhisper in the build to compile its kernels. They are read from
setup.cfg's install_requires, the one list of them."""

import configparser
import os

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403  (every hook setuptools defines)


def runtime_requirements():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.cfg"))
    lines = cfg.get("options", "install_requires").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + runtime_requirements()
