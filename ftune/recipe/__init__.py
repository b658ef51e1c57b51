"""The recipe language: typed schema, loading (extends, interpolation, overrides), rules."""

from ftune.recipe._secrets import shown_override
from ftune.recipe._yaml import parse as parse_yaml
from ftune.recipe.load import MASK, LoadedRecipe, load_recipe

__all__ = ["MASK", "LoadedRecipe", "load_recipe", "parse_yaml", "shown_override"]
