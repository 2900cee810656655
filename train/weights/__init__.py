"""Weights from outside a run: pretrained ViT files (`pretrained`) and the safetensors format (`safetensors`)."""
