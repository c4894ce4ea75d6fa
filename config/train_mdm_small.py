# Baseline: an encoder-only masked diffusion model of AO-GPT-Small's size: the same blocks with full
# attention and a [MASK] token (GPT-2's first padding id, 50257), trained on the MDM ELBO, with the
# same optimizer and schedule as AO-GPT-Small so the comparison isolates the formulation.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_mdm_small.py
out_dir = 'out-mdm-small'
wandb_run_name = 'mdm-small'
causal = False
cond = 'none'
