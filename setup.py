"""Packaging glue: pyproject.toml holds the metadata; this maps the top-level templates/ folder
to the importable package ``advisor_templates`` so installed wheels carry the HTML templates."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["advisor", "advisor.*", "rules", "rules.*"]), "advisor_templates"],
    package_dir={"advisor_templates": "templates"},
)
