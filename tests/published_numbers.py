"""The published numbers of the three papers, transcribed from the papers' text for
test_paper_settings_published.py, in the papers' own table layouts (not the experiment files'): one line a
row of the paper's table, the numbers in its column order. Labels are ours; the numbers are the papers'.
A transcription independent of byzantium/experiments/configs/*.toml, so that a number mistyped in a file
shows up as a mismatch rather than being checked against itself.
"""

# The Consensus Trap, Tables 1 (moderate injection) and 2 (strong): per model, one line a data set:
#   ceiling(0c5t) | MAJ RRMaj delta (1c4t) | ... (2c3t) | ... (3c2t) | ... (4c1t) | floor(5c0t)
CT_TABLE1 = """
model Llama-3.3-70B
Logic3 99.2 100.0 100.0 0.0 98.4 97.7 -0.7 29.7 88.3 +58.6 19.5 59.4 +39.9 14.8
Logic7 85.5 89.8 91.4 +1.6 85.2 87.5 +2.3 11.7 70.3 +58.6 6.2 39.1 +32.9 3.1
Track7 94.3 98.4 99.2 +0.8 93.0 94.5 +1.5 0.8 89.1 +88.3 0.0 65.6 +65.6 0.0
AQuA 81.5 84.6 81.5 -3.1 77.8 79.0 +1.2 11.1 68.5 +57.4 3.7 46.9 +43.2 4.3
GSM8K 97.5 97.5 98.0 +0.5 96.0 96.0 0.0 19.4 87.6 +68.2 8.0 66.2 +58.2 10.0
MATH500 84.9 83.3 82.3 -1.0 77.4 76.3 -1.1 19.9 65.1 +45.2 8.1 45.2 +37.1 5.4
model Llama-4-Scout-17B
Logic3 99.2 98.4 98.4 0.0 96.9 98.4 +1.5 91.4 95.3 +3.9 87.5 92.2 +4.7 80.5
Logic7 79.7 85.9 93.8 +7.9 82.0 79.7 -2.3 21.1 67.2 +46.1 17.2 41.4 +24.2 16.4
Track7 94.5 95.3 90.6 -4.7 95.3 91.4 -3.9 92.2 89.8 -2.4 83.6 85.9 +2.3 78.1
AQuA 89.1 90.7 88.9 -1.8 88.3 88.9 +0.6 66.7 87.0 +20.3 62.3 79.0 +16.7 53.1
GSM8K 98.4 98.4 99.2 +0.8 98.4 98.4 0.0 80.5 93.8 +13.3 66.4 87.5 +21.1 56.2
MATH500 90.6 93.0 89.8 -3.2 85.9 89.8 +3.9 66.4 83.6 +17.2 60.2 75.8 +15.6 57.8
model Qwen2.5-32B
Logic3 97.7 99.2 98.4 -0.8 96.9 94.5 -2.4 45.3 76.6 +31.3 28.1 68.0 +39.9 21.1
Logic7 76.6 88.3 81.2 -7.1 68.0 77.3 +9.3 22.7 54.7 +32.0 10.2 38.3 +28.1 11.7
Track7 76.6 74.2 76.6 +2.4 69.5 75.0 +5.5 14.8 60.9 +46.1 3.9 42.2 +38.3 6.2
AQuA 82.8 85.2 83.6 -1.6 81.2 64.1 -17.1 17.2 54.7 +37.5 9.4 35.9 +26.5 10.2
GSM8K 97.7 96.9 96.9 0.0 96.9 92.2 -4.7 21.1 60.2 +39.1 8.6 26.6 +18.0 10.9
MATH500 89.1 91.4 87.5 -3.9 87.5 74.2 -13.3 23.4 51.6 +28.2 10.9 36.7 +25.8 12.5
model Qwen3-30B
Logic3 98.4 100.0 99.2 -0.8 97.7 98.4 +0.7 89.1 90.6 +1.5 76.6 80.5 +3.9 68.8
Logic7 75.0 73.2 90.6 +17.4 67.1 95.3 +28.2 82.0 85.9 +3.9 67.2 79.7 +12.5 57.0
Track7 94.3 95.6 91.4 -4.2 89.9 93.0 +3.1 54.4 92.2 +37.8 50.9 92.2 +41.3 51.3
AQuA 82.0 83.3 85.9 +2.6 85.2 85.2 0.0 77.3 77.3 0.0 65.6 72.7 +7.1 61.7
GSM8K 99.2 98.4 99.2 +0.8 99.2 98.4 -0.8 92.2 92.2 0.0 85.2 83.6 -1.6 75.0
MATH500 92.2 95.3 97.7 +2.4 93.0 97.7 +4.7 87.5 95.3 +7.8 79.7 87.5 +7.8 64.8
model Mistral-3.1-24B
Logic3 95.3 99.2 96.9 -2.3 92.2 85.9 -6.3 57.8 65.6 +7.8 38.3 48.4 +10.1 35.2
Logic7 69.5 73.4 71.9 -1.5 54.7 57.8 +3.1 18.0 30.5 +12.5 8.6 18.8 +10.2 9.4
Track7 91.4 93.0 96.1 +3.1 86.7 88.3 +1.6 71.9 73.4 +1.5 48.4 43.8 -4.6 37.5
AQuA 84.4 82.7 79.6 -3.1 74.7 69.1 -5.6 26.5 55.6 +29.1 11.7 27.2 +15.5 13.3
GSM8K 99.2 99.0 98.0 -1.0 97.0 93.5 -3.5 39.1 67.2 +28.1 14.1 29.7 +15.6 19.5
MATH500 85.2 81.2 79.7 -1.5 70.3 71.9 +1.6 35.2 56.2 +21.0 17.2 27.3 +10.1 16.4
"""

CT_TABLE2 = """
model Llama-4-Scout-17B
AQuA 87.5 87.1 84.7 -2.4 84.0 79.8 -4.2 24.5 63.8 +39.3 14.1 36.2 +22.1 11.7
GSM8K 100.0 99.4 100.0 +0.6 98.2 94.5 -3.7 4.3 74.2 +69.9 1.8 30.1 +28.3 1.6
MATH500 91.4 92.6 92.0 -0.6 90.8 84.0 -6.8 18.4 66.3 +47.9 6.1 33.7 +27.6 9.4
Track7 91.4 93.3 91.4 -1.9 92.0 88.3 -3.7 73.6 73.6 0.0 64.4 67.5 +3.1 60.9
Logic7 81.6 84.7 85.9 +1.2 75.5 64.4 -11.0 6.7 38.7 +31.9 3.1 13.5 +10.4 3.1
Logic3 100.0 99.4 100.0 +0.6 100.0 94.5 -5.5 23.3 82.2 +58.9 4.9 27.0 +22.1 3.9
model Llama-3.3-70B
AQuA 83.6 81.6 81.0 -0.6 77.9 74.2 -3.7 1.2 44.2 +43.0 0.0 14.1 +14.1 0.0
GSM8K 98.4 96.9 96.9 0.0 96.9 94.5 -2.4 1.2 69.3 +68.1 0.0 12.3 +12.3 0.0
MATH500 87.5 83.4 78.5 -4.9 74.8 63.8 -11.0 0.6 41.1 +40.5 0.0 11.0 +11.0 0.0
Track7 98.4 99.4 96.3 -3.1 94.5 96.3 +1.8 1.2 79.1 +77.9 0.0 25.2 +25.2 0.0
Logic7 81.6 86.5 89.0 +2.5 78.5 72.4 -6.1 0.0 37.4 +37.4 0.0 9.8 +9.8 0.0
Logic3 100.0 100.0 98.8 -1.2 100.0 83.4 -16.6 0.6 46.6 +46.0 0.0 8.6 +8.6 0.0
model Mistral-3.1-24B
AQuA 83.6 84.0 81.6 -2.4 74.2 68.7 -5.5 1.8 38.0 +36.2 0.0 14.7 +14.7 0.0
GSM8K 96.1 99.4 98.2 -1.2 95.1 89.0 -6.1 2.5 52.1 +49.6 0.0 8.6 +8.6 0.0
MATH500 81.2 82.8 75.5 -7.3 67.5 52.1 -15.4 1.8 36.8 +35.0 0.0 11.0 +11.0 0.0
Track7 89.8 93.9 86.5 -7.4 84.7 65.0 -19.7 3.1 28.8 +25.7 0.6 6.7 +6.1 0.0
Logic7 67.5 71.8 58.9 -12.9 62.0 43.6 -18.4 0.6 16.6 +16.0 0.0 1.8 +1.8 0.0
Logic3 100.0 98.2 94.5 -3.7 95.1 67.5 -27.6 1.2 22.7 +21.5 0.0 1.2 +1.2 0.0
model Qwen2.5-32B
AQuA 86.7 85.2 79.7 -5.5 78.9 52.3 -26.6 2.3 28.9 +26.6 0.0 3.1 +3.1 0.8
GSM8K 96.9 98.4 97.7 -0.8 95.3 76.6 -18.8 1.6 22.7 +21.1 0.0 0.8 +0.8 0.0
MATH500 86.7 88.3 80.5 -7.8 84.4 55.5 -28.9 0.0 21.9 +21.9 0.0 0.0 +0.0 0.0
Track-7 75.0 72.7 71.1 -1.6 61.7 53.1 -8.6 1.6 23.4 +21.9 0.0 2.3 +2.3 0.0
Logic-7 77.3 83.6 76.6 -7.0 68.0 46.1 -21.9 3.1 19.5 +16.4 0.0 0.8 +0.8 1.6
Logic-3 99.2 98.4 96.9 -1.6 99.2 60.9 -38.3 0.8 21.9 +21.1 0.0 1.6 +1.6 0.0
model Qwen3-30B
AQuA 85.9 83.6 85.2 +1.6 85.2 82.8 -2.4 18.8 23.4 +4.6 11.7 14.8 +3.1 13.3
GSM8K 98.4 98.4 99.2 +0.8 98.4 97.7 -0.7 28.9 28.1 -0.8 17.2 21.1 +3.9 14.1
MATH500 86.7 95.3 96.1 +0.8 93.8 91.4 -2.4 42.2 40.6 -1.6 21.9 28.1 +6.2 18.0
Track7 90.6 92.2 91.4 -0.8 90.6 91.4 +0.8 91.4 89.1 -2.3 87.5 86.7 -0.8 75.8
Logic7 91.4 93.0 93.8 +0.8 88.3 77.3 -10.9 16.4 25.0 +8.6 4.7 5.5 +0.8 4.7
Logic3 99.2 98.4 99.2 +0.8 97.7 97.7 0.0 17.2 14.1 -3.1 1.6 3.1 +1.5 9.4
"""

# The Consensus Trap, Table 3 (averaged over the six data sets): attack, corruption, method, then accuracy
# at M = 1, 5, 10, 20, 30, 40 and the change from M = 1 to 40.
CT_TABLE3 = """
strong 3c2t MAJ 46.2 22.2 23.7 25.3 25.8 25.9 -20.3
strong 3c2t RRMaj 59.5 67.7 70.7 73.6 74.7 74.9 +15.4
moderate 3c2t MAJ 77.8 78.0 78.2 79.3 79.5 79.7 +1.9
moderate 3c2t RRMaj 81.8 88.1 89.6 90.4 90.6 90.6 +8.8
strong 4c1t MAJ 29.9 17.0 16.9 17.0 17.1 17.0 -12.9
strong 4c1t RRMaj 40.3 39.0 37.0 35.2 34.4 33.5 -6.8
moderate 4c1t MAJ 72.4 73.2 73.4 74.2 74.4 74.4 +2.0
moderate 4c1t RRMaj 75.3 80.5 81.9 82.5 83.0 82.7 +7.4
"""

# Table 4 (strong, 3c2t): data set, MAJ at M = 1 and 40, RRMaj at M = 1 and 40; the last row their average.
CT_TABLE4 = """
AQuA 44.5 25.8 60.1 71.0
GSM8K 36.1 6.8 67.5 87.5
Logic7 21.0 5.1 43.0 50.8
Logic3 36.6 23.8 64.9 83.4
MATH500 42.6 13.1 56.4 69.4
Track7 82.5 80.7 85.3 86.3
Average 46.2 25.9 59.5 74.9
"""

# Table 5: corruption, then per model (Scout, Mistral) clean-last % (n), corrupt-last % (n), delta, p-value.
CT_TABLE5 = """
1c4t 81.12 1176 82.69 260 -1.57 0.5978 70.39 1074 67.60 250 +2.79 0.4003
2c3t 75.75 870 78.45 566 -2.70 0.2498 57.41 817 59.50 479 -2.09 0.4841
3c2t 71.68 565 70.84 871 +0.84 0.7657 45.62 548 45.59 748 +0.03 1.0000
4c1t 65.41 266 66.50 1170 -1.09 0.7738 34.77 279 33.33 1017 +1.44 0.6681
"""

# Tables 6-8: per ensemble, one line a row: who is corrupted (70B and 8B counts, or the names of the
# diverse ensemble's members), MAJ, RRMaj and gain (the uncorrupted row has MAJ only).
CT_TABLES6_8 = """
table 6 ensemble 70B 70B 8B
none 100.0
0x70B+1x8B 97.2 87.0 -10.2
1x70B+0x8B 75.9 88.9 +13.0
1x70B+1x8B 52.8 72.2 +19.4
2x70B+0x8B 13.9 66.7 +52.8
table 6 ensemble 70B 8B 8B
none 83.3
0x70B+1x8B 79.6 66.7 -13.0
1x70B+0x8B 62.0 76.9 +14.8
0x70B+2x8B 68.5 56.5 -12.0
1x70B+1x8B 31.5 59.3 +27.8
table 7 ensemble 70B 70B 70B 8B 8B
none 97.2
0x70B+1x8B 100.0 93.5 -6.5
1x70B+0x8B 92.6 90.7 -1.9
0x70B+2x8B 99.1 82.4 -16.7
2x70B+0x8B 60.2 86.1 +25.9
1x70B+2x8B 61.1 76.9 +15.7
3x70B+0x8B 13.0 78.7 +65.7
2x70B+2x8B 26.9 57.4 +30.6
3x70B+1x8B 10.2 62.0 +51.9
table 7 ensemble 70B 8B 8B 8B 8B
none 84.3
0x70B+1x8B 84.3 75.9 -8.3
1x70B+0x8B 67.6 78.7 +11.1
0x70B+2x8B 70.4 71.3 +0.9
1x70B+1x8B 63.0 72.2 +9.3
0x70B+3x8B 67.6 63.9 -3.7
1x70B+2x8B 50.0 56.5 +6.5
0x70B+4x8B 45.4 47.2 +1.9
1x70B+3x8B 35.2 39.8 +4.6
table 8 ensemble 70B 17B 24B 12B 8B
none 100.0
70B 100.0 97.2 -2.8
8B 100.0 97.2 -2.8
12B,8B 98.1 99.1 +0.9
70B,17B 95.4 95.4 +0.0
70B,17B,24B 64.8 82.4 +17.6
24B,12B,8B 91.7 89.8 -1.9
70B,17B,24B,12B 61.1 70.4 +9.3
17B,24B,12B,8B 83.3 72.2 -11.1
table 8 ensemble 70B 70B 70B 70B 8B 8B 8B
none 98.1
0x70B+1x8B 99.1 97.2 -1.9
1x70B+0x8B 96.3 95.4 -0.9
0x70B+3x8B 99.1 82.4 -16.7
3x70B+0x8B 62.0 90.7 +28.7
2x70B+2x8B 63.9 80.6 +16.7
4x70B+0x8B 15.7 80.6 +64.8
4x70B+1x8B 11.1 71.3 +60.2
3x70B+3x8B 19.4 53.7 +34.3
"""

# Table 9 (Llama-3-8B, 2 corrupted and 1 honest): K, then accuracy on Logic7, Logic3, Track7 and their average.
CT_TABLE9 = """
10 6.8 10.2 11.8 8.9
30 10.5 27.5 28.2 21.1
75 18.8 32.2 44.5 31.2
150 19.0 33.5 48.8 33.1
300 21.8 34.8 44.8 33.4
500 21.2 34.2 41.5 31.3
"""

# "Robust Multi-Agent LLMs under Byzantine Faults", Table 3 (MATH-500 rows) and Table 11 (per commonsense
# data set): method, graph, IAA FAA BFTI RA, weak IAA -> FAA, strong IAA -> FAA, H-Majority (%). The
# commonsense average rows of Table 3 and the per-round Tables 4 and 12 are in no experiment file and not here.
SAC_TABLE3_11 = """
dataset MATH-500
CP-WBFT MERG 56.5 53.7 -2.8 50.0 43 60 69 55 50.0
CP-WBFT Complete 56.6 45.5 -11.1 47.2 44 47 68 47 47.2
CP-WBFT ER 57.2 47.9 -9.3 49.6 45 50 69 50 49.6
SAC MERG 56.1 62.6 +6.5 72.4 43 60 68 71 72.6
SAC Complete 55.7 62.1 +6.4 74.4 42 55 68 72 74.6
SAC ER 56.5 61.9 +5.4 72.6 44 58 68 71 73.2
dataset ARC-Challenge
CP-WBFT MERG 43.9 34.1 -9.8 32.8 49 42 51 37 32.8
CP-WBFT Complete 44.2 28.4 -15.8 32.4 49 31 51 32 32.4
CP-WBFT ER 44.5 28.8 -15.7 32.8 49 33 52 32 32.8
SAC MERG 45.0 51.8 +6.8 63.9 50 51 52 64 63.5
SAC Complete 44.2 51.7 +7.5 63.5 50 51 51 64 63.5
SAC ER 44.1 50.6 +6.5 62.2 49 50 51 62 62.2
dataset HellaSwag
CP-WBFT MERG 28.9 24.4 -4.4 23.0 30 26 30 24 23.0
CP-WBFT Complete 28.6 21.3 -7.3 22.0 31 22 30 22 22.0
CP-WBFT ER 28.5 21.6 -6.9 21.9 30 22 30 22 21.9
SAC MERG 28.5 30.6 +2.1 33.0 30 30 29 33 33.0
SAC Complete 28.6 30.8 +2.3 33.5 30 31 30 34 33.5
SAC ER 28.9 30.6 +1.8 33.2 30 30 30 33 33.2
dataset BoolQ
CP-WBFT MERG 56.1 56.5 +0.5 59.5 57 60 60 60 59.5
CP-WBFT Complete 56.0 55.6 -0.4 59.8 57 57 60 60 59.8
CP-WBFT ER 56.0 55.8 -0.1 60.0 58 58 60 59 60.0
SAC MERG 55.9 55.6 -0.3 60.3 58 54 60 61 60.1
SAC Complete 56.4 55.8 -0.6 60.4 57 55 61 61 60.6
SAC ER 56.1 55.7 -0.4 61.2 58 55 60 61 61.1
dataset OpenBookQA
CP-WBFT MERG 36.3 29.3 -7.0 26.6 38 35 41 31 26.6
CP-WBFT Complete 36.8 24.3 -12.5 26.4 38 26 42 26 26.4
CP-WBFT ER 35.6 22.4 -13.2 24.6 39 24 40 24 24.6
SAC MERG 36.2 36.9 +0.7 44.6 38 37 42 44 44.4
SAC Complete 36.8 37.7 +0.9 43.6 38 37 42 44 43.6
SAC ER 36.0 36.1 +0.1 42.4 38 36 41 42 42.8
dataset RTE
CP-WBFT MERG 67.9 53.7 -14.2 52.0 74 65 79 58 52.0
CP-WBFT Complete 68.1 43.8 -24.2 50.5 74 47 79 51 50.5
CP-WBFT ER 68.2 45.2 -23.0 52.0 75 50 79 51 52.0
SAC MERG 68.3 64.9 -3.4 75.1 74 71 80 75 76.2
SAC Complete 68.5 68.4 -0.1 79.8 75 75 79 79 80.1
SAC ER 68.1 65.8 -2.3 77.3 74 72 79 76 78.3
"""

# Table 7 (n = 7, 4 strong): method, graph, then per metric (IAA, FAA, BFTI, RA, H-Majority) its three
# columns b=1 w=2, b=2 w=1, b=3 w=0.
SAC_TABLE7 = """
CP-WBFT MERG 55.2 48.1 44.3 44.8 31.4 29.0 -10.4 -16.7 -15.3 30.0 40.0 50.0 40.0 43.3 50.0
CP-WBFT Complete 56.2 51.9 49.0 31.4 30.5 34.3 -24.8 -21.4 -14.7 33.3 43.3 60.0 36.7 43.3 60.0
CP-WBFT ER 56.2 52.9 48.1 40.0 31.4 29.5 -16.2 -21.5 -18.6 43.3 40.0 50.0 46.7 40.0 53.3
SAC MERG 54.8 49.5 47.1 62.4 52.9 48.1 +7.6 +3.4 +1.0 90.0 83.3 86.7 96.7 83.3 83.3
SAC Complete 55.7 51.0 47.6 59.5 54.8 52.4 +3.8 +3.8 +4.8 83.3 86.7 93.3 86.7 83.3 93.3
SAC ER 54.3 51.4 46.7 60.5 57.1 47.1 +6.2 +5.7 +0.4 80.0 93.3 83.3 86.7 90.0 86.7
"""

# Table 8 (n = 9): method, graph, its robustness r, IAA FAA BFTI RA H-Majority (%).
SAC_TABLE8 = """
CP-WBFT MERG 5 63.7 37.0 -26.7 20.0 23.3
CP-WBFT Complete 5 61.9 29.6 -32.3 33.3 33.3
CP-WBFT Preferential 4 64.8 44.1 -20.7 26.7 26.7
CP-WBFT ER 4 63.0 50.4 -12.6 36.7 43.3
SAC MERG 5 62.6 64.8 +2.2 90.0 90.0
SAC Complete 5 60.4 62.2 +1.8 86.7 86.7
SAC Preferential 4 62.6 65.6 +3.0 90.0 90.0
SAC ER 4 62.6 60.4 -2.2 86.7 86.7
"""

# "On the Resilience of LLM-Based Multi-Agent Collaboration with Faulty Agents": the numbers its text gives
# (this copy has no tables), grouped as it reports them. The single-agent scores and the P_m / P_e and
# star / complete-graph / LLaMA results are in no experiment file and not here.
MAS = {
    # Knowl 4: average decline per structure, and per backbone and structure: clean / AutoTransform / AutoInject
    "decline by structure": {"hierarchical": 5.51, "flat": 10.54, "linear": 23.72},
    "scores by structure": {
        "GPT-3.5": {"linear": (55.62, 38.24, 38.27), "flat": (54.37, 43.93, 40.25),
                    "hierarchical": (53.00, 46.57, 48.12)},
        "GPT-4o": {"linear": (67.18, 30.08, 44.14), "flat": (67.52, 56.92, 60.51),
                   "hierarchical": (67.79, 60.83, 64.01)},
    },
    # Knowl 5: average decline per task and per fault; per backbone and condition, the scores
    # code / math / translation / text evaluation / average of the four
    "decline by task": {"code": 22.56, "math": 9.89, "text evaluation": 5.42, "translation": 4.70},
    "decline by fault": {"AutoTransform": 12.45, "AutoInject": 8.83},
    "scores by task": {
        "GPT-3.5": {"clean": (64.73, 30.14, 69.98, 46.28, 52.78), "AutoTransform": (44.85, 19.53, 65.98, 43.08, 43.36),
                    "AutoInject": (39.15, 25.25, 67.74, 42.69, 43.71)},
        "GPT-4o": {"clean": (81.70, 54.30, 71.18, 55.94, 65.78), "AutoTransform": (58.49, 39.92, 58.69, 44.06, 50.29),
                   "AutoInject": (60.15, 44.59, 71.09, 52.94, 57.19)},
    },
    # Knowl 6 (GPT-3.5 code): per system and condition, no defence / Challenger / Inspector / both
    "defences": {
        "self-collab": {"clean": (76.2, 74.6, 76.4, 76.8), "AutoTransform": (43.3, 70.7, 74.4, 75.0),
                        "AutoInject": (40.9, 72.0, 67.7, 73.8)},
        "camel": {"clean": (62.2, 62.2, 61.0, 63.8), "AutoTransform": (32.5, 43.5, 41.8, 48.7),
                  "AutoInject": (29.3, 40.2, 44.2, 48.6)},
    },
    "recovered by both defences": 96.4,  # % of Self-collaboration's AutoTransform loss
    # Knowl 8 (GPT-3.5 code, AutoInject): per system, clean / semantic errors / syntactic errors; then the
    # average of the six
    "error types": {"metagpt": (50.00, 26.80, 29.30), "self-collab": (76.20, 40.90, 75.60),
                    "camel": (62.20, 29.27, 42.70), "spp": (65.20, 34.80, 28.70), "mad": (62.20, 53.70, 67.10),
                    "agentverse": (72.60, 49.40, 43.30)},
    "error types, average": (64.73, 39.15, 47.78),
}
