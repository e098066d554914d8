"""Palomino: coevolutionary GAN training (Lipizzaner) on a toroidal grid of cells."""

__version__ = "0.1.0"
