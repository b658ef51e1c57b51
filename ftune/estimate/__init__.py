"""What a recipe will cost, apart from the compiler: parameters and memory on the meta device, no weights read."""
