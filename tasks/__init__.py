"""Stage implementations: each module holds plain functions plus one `Stage` that wraps them."""
