"""The recipe language: typed schema, loading (extends, interpolation, overrides), rules."""

from ftune.recipe._interp import is_secret_name
from ftune.recipe.load import MASK, LoadedRecipe, load_recipe

__all__ = ["MASK", "LoadedRecipe", "is_secret_name", "load_recipe"]
