"""The scorer: FID / IS / KID / TVD / modes of mixtures from the score queue (torch)."""
