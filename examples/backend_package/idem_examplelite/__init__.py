"""idem-examplelite: an idem-dialects backend shipped by another distribution (see README.md)."""
