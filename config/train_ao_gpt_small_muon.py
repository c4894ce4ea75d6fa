# AO-GPT-Small (config/train_ao_gpt_small.py, the paper's card) with optimizer=muon: torch.optim.Muon for the
# blocks' hidden matrices and the AdaLN Linears, AdamW (the card's learning_rate, betas, weight_decay) for the
# embeddings, head, norms and biases, every group on the card's warmup/cosine schedule at its own peak. At the
# findings' CPU scale Muon reached AdamW's final any-order loss in about a third of the steps (finding 9,
# results/); at this size it has not been run yet.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_ao_gpt_small_muon.py
out_dir = 'out-muon'
wandb_run_name = 'ao-gpt-small-muon'
adaln_table = True  # as the card
optimizer = 'muon'
muon_lr = 0.02  # the anchors' scale for GPT-2 Small (modded-nanogpt); the findings' 2-layer model did best at 0.01
