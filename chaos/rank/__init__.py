"""Code that runs inside every training rank (loaded by sitecustomize); may import torch."""
