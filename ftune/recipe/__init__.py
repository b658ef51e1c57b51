"""The recipe language: typed schema, loading (extends, interpolation, overrides), rules."""

from ftune.recipe.load import MASK, LoadedRecipe, load_recipe

__all__ = ["MASK", "LoadedRecipe", "load_recipe"]
